#include "runtime/model/model.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>

namespace ashlar {

std::string tensor_shape::to_string() const {
  if (flat())
    return std::to_string(c);
  return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
}

const char* to_string(layer_kind k) {
  switch (k) {
    case layer_kind::dense: return "dense";
    case layer_kind::conv2d: return "conv2d";
    case layer_kind::maxpool: return "maxpool";
    case layer_kind::avgpool: return "avgpool";
    case layer_kind::relu: return "relu";
    case layer_kind::flatten: return "flatten";
    case layer_kind::dropout: return "dropout";
    case layer_kind::groupnorm: return "groupnorm";
    case layer_kind::add: return "add";
    case layer_kind::external: return "external";
  }
  return "?";
}

namespace {

caf::error bad(const std::string& msg) {
  return make_error(errc::invalid_config, msg);
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos)
    return {};
  auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool parse_u64(const std::string& text, uint64_t& out) {
  if (text.empty() || text[0] == '-' || text[0] == '+')
    return false;
  errno = 0;
  char* end = nullptr;
  auto v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0')
    return false;
  out = v;
  return true;
}

bool parse_real(const std::string& text, double& out) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(v))
    return false;
  out = v;
  return true;
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64)
    return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
      return false;
  return true;
}

std::string show_real(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Which keys each kind takes (beyond name and input).
bool takes(layer_kind k, const std::string& key) {
  switch (k) {
    case layer_kind::dense: return key == "out";
    case layer_kind::conv2d: return key == "out" || key == "kernel" || key == "stride" || key == "padding";
    case layer_kind::maxpool:
    case layer_kind::avgpool: return key == "kernel" || key == "stride" || key == "padding";
    case layer_kind::dropout: return key == "p";
    case layer_kind::groupnorm: return key == "groups" || key == "eps";
    case layer_kind::add: return key == "from";
    case layer_kind::external: return key == "params" || key == "out";
    case layer_kind::relu:
    case layer_kind::flatten: return false;
  }
  return false;
}

const char* keys_of(layer_kind k) {
  switch (k) {
    case layer_kind::dense: return "out";
    case layer_kind::conv2d: return "out, kernel, stride, padding";
    case layer_kind::maxpool:
    case layer_kind::avgpool: return "kernel, stride, padding";
    case layer_kind::dropout: return "p";
    case layer_kind::groupnorm: return "groups, eps";
    case layer_kind::add: return "from";
    case layer_kind::external: return "params, out";
    case layer_kind::relu:
    case layer_kind::flatten: return "none";
  }
  return "";
}

expected<layer_spec> parse_layer(const std::string& text, size_t index) {
  std::istringstream in{text};
  std::string word;
  in >> word;
  const std::string where = "model.layers[" + std::to_string(index) + "] '" + text + "'";
  static const std::map<std::string, layer_kind> kinds = {
    {"dense", layer_kind::dense},         {"linear", layer_kind::dense},
    {"conv2d", layer_kind::conv2d},       {"conv", layer_kind::conv2d},
    {"maxpool", layer_kind::maxpool},     {"avgpool", layer_kind::avgpool},
    {"relu", layer_kind::relu},           {"flatten", layer_kind::flatten},
    {"dropout", layer_kind::dropout},     {"groupnorm", layer_kind::groupnorm},
    {"layernorm", layer_kind::groupnorm}, {"add", layer_kind::add},
    {"external", layer_kind::external},
  };
  auto k = kinds.find(word);
  if (k == kinds.end())
    return bad(where + ": unknown layer kind '" + word
               + "' (known: dense, conv2d, maxpool, avgpool, relu, flatten, dropout, groupnorm, layernorm, add, "
                 "external)");
  layer_spec l;
  l.kind = k->second;
  l.layernorm = word == "layernorm";
  std::string kv;
  while (in >> kv) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size())
      return bad(where + ": '" + kv + "' is not KEY=VALUE");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "name" || key == "input" || key == "from") {
      if (!valid_name(value))
        return bad(where + ": " + key + " '" + value + "' is not a layer name (letters, digits, _ - .)");
      if (key == "from" && l.kind != layer_kind::add)
        return bad(where + ": " + word + " takes no key 'from' (keys: name, input, " + keys_of(l.kind) + ")");
      (key == "name" ? l.name : key == "input" ? l.input : l.from) = value;
      continue;
    }
    if (!takes(l.kind, key) || (l.layernorm && key == "groups"))
      return bad(where + ": " + word + " takes no key '" + key + "' (keys: name, input, "
                 + (l.layernorm ? "eps" : keys_of(l.kind)) + ")");
    if (key == "p" || key == "eps") {
      double v = 0;
      if (!parse_real(value, v))
        return bad(where + ": " + key + " '" + value + "' is not a number");
      (key == "p" ? l.p : l.eps) = v;
      continue;
    }
    uint64_t v = 0;
    if (!parse_u64(value, v) || (key != "params" && v > UINT32_MAX))
      return bad(where + ": " + key + " '" + value + "' is not a non-negative integer");
    if (key == "params")
      l.params = v;
    else if (key == "out")
      l.out = static_cast<uint32_t>(v);
    else if (key == "kernel")
      l.kernel = static_cast<uint32_t>(v);
    else if (key == "stride")
      l.stride = static_cast<uint32_t>(v);
    else if (key == "padding")
      l.padding = static_cast<uint32_t>(v);
    else if (key == "groups")
      l.groups = static_cast<uint32_t>(v);
  }
  return l;
}

}  // namespace

expected<std::vector<layer_spec>> parse_layers(const std::string& text) {
  std::vector<layer_spec> out;
  std::string item;
  std::string norm = text;
  for (auto& c : norm)
    if (c == '\n')
      c = ';';
  std::stringstream ss{norm};
  while (std::getline(ss, item, ';')) {
    item = trim(item);
    if (item.empty())
      continue;
    auto l = parse_layer(item, out.size());
    if (!l)
      return l.error();
    out.push_back(std::move(*l));
  }
  return out;
}

std::string layers_text(const std::vector<layer_spec>& layers) {
  std::string s;
  for (const auto& l : layers) {
    if (!s.empty())
      s += "; ";
    s += l.layernorm ? "layernorm" : to_string(l.kind);
    auto add = [&](const char* key, const std::string& v) { s += std::string{" "} + key + "=" + v; };
    if (!l.name.empty())
      add("name", l.name);
    if (!l.input.empty())
      add("input", l.input);
    switch (l.kind) {
      case layer_kind::dense:
        add("out", std::to_string(l.out));
        break;
      case layer_kind::conv2d:
        add("out", std::to_string(l.out));
        [[fallthrough]]; // and the window, as a pool's
      case layer_kind::maxpool:
      case layer_kind::avgpool:
        if (l.kernel)
          add("kernel", std::to_string(l.kernel));
        if (l.stride)
          add("stride", std::to_string(l.stride));
        if (l.padding)
          add("padding", std::to_string(l.padding));
        break;
      case layer_kind::dropout:
        add("p", show_real(l.p));
        break;
      case layer_kind::groupnorm:
        if (!l.layernorm)
          add("groups", std::to_string(l.groups));
        add("eps", show_real(l.eps));
        break;
      case layer_kind::add:
        add("from", l.from);
        break;
      case layer_kind::external:
        add("params", std::to_string(l.params));
        if (l.out)
          add("out", std::to_string(l.out));
        break;
      case layer_kind::relu:
      case layer_kind::flatten:
        break;
    }
  }
  return s;
}

std::vector<layer_spec> model_spec::resolved() const {
  std::vector<layer_spec> out;
  if (!layers.empty()) {
    out = layers;
  } else {
    if (!input.flat()) {
      layer_spec flat;
      flat.kind = layer_kind::flatten;
      out.push_back(flat);
    }
    for (auto h : hidden) {
      layer_spec d;
      d.kind = layer_kind::dense;
      d.out = h;
      out.push_back(d);
      out.push_back(layer_spec{}); // relu
    }
    layer_spec last;
    last.kind = layer_kind::dense;
    last.out = classes;
    out.push_back(last);
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].name.empty())
      out[i].name = std::string{out[i].layernorm ? "layernorm" : ashlar::to_string(out[i].kind)} + std::to_string(i);
  return out;
}

bool model_plan::has_external() const {
  for (const auto& n : nodes)
    if (n.spec.kind == layer_kind::external)
      return true;
  return false;
}

std::vector<int> model_plan::output_owners() const {
  std::vector<int> owner(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    const bool identity = n.spec.kind == layer_kind::flatten || (n.spec.kind == layer_kind::dropout && n.spec.p == 0);
    owner[i] = identity && i + 1 < nodes.size() ? (n.input < 0 ? -1 : owner[static_cast<size_t>(n.input)])
                                                : static_cast<int>(i);
  }
  return owner;
}

std::vector<bool> model_plan::gradients_needed() const {
  std::vector<bool> needed(nodes.size(), false);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    needed[i] = n.param_count() > 0 || (n.input >= 0 && needed[static_cast<size_t>(n.input)])
                || (n.from >= 0 && needed[static_cast<size_t>(n.from)]);
  }
  return needed;
}

expected<model_plan> compile(const model_spec& spec) {
  if (spec.input.size() == 0)
    return bad("model.input " + spec.input.to_string() + " has a zero dimension");
  if (spec.input.size() > (uint64_t{1} << 26))
    return bad("model.input " + spec.input.to_string() + " is over 2^26 floats per sample");
  if (spec.classes < 2)
    return bad("model.classes must be >= 2");
  if (spec.layers.empty())
    for (size_t i = 0; i < spec.hidden.size(); ++i)
      if (spec.hidden[i] == 0)
        return bad("model.hidden[" + std::to_string(i) + "] must be > 0");
  model_plan plan;
  plan.input = spec.input;
  plan.classes = spec.classes;
  auto layers = spec.resolved();
  if (layers.empty())
    return bad("model.layers is empty");
  std::map<std::string, int> by_name;
  uint64_t pos = 0;
  constexpr uint64_t max_params = uint64_t{1} << 32;
  for (size_t i = 0; i < layers.size(); ++i) {
    plan_node n;
    n.spec = layers[i];
    auto& l = n.spec;
    const std::string where = "model.layers[" + std::to_string(i) + "] '" + l.name + "'";
    if (by_name.count(l.name))
      return bad(where + ": the name is used by layer " + std::to_string(by_name[l.name]));
    n.input = static_cast<int>(i) - 1;
    if (!l.input.empty()) {
      auto it = by_name.find(l.input);
      if (it == by_name.end() && l.input != "input")
        return bad(where + ": input '" + l.input + "' names no earlier layer");
      n.input = it == by_name.end() ? -1 : it->second;
    }
    n.in = n.input < 0 ? spec.input : plan.nodes[static_cast<size_t>(n.input)].out;
    const auto& in = n.in;
    auto refuse = [&](const std::string& why) {
      return bad(where + ": " + to_string(l.kind) + " " + why + ", got input " + in.to_string());
    };
    switch (l.kind) {
      case layer_kind::dense:
        if (l.out == 0)
          return bad(where + ": dense needs out > 0");
        if (!in.flat())
          return refuse("needs a flat input (add flatten before it)");
        n.out = tensor_shape{l.out, 1, 1};
        n.fan_in = in.c;
        n.weight_size = uint64_t{l.out} * in.c;
        n.bias_size = l.out;
        break;
      case layer_kind::conv2d: {
        if (l.out == 0)
          return bad(where + ": conv2d needs out > 0");
        if (l.kernel == 0)
          l.kernel = 3;
        if (l.stride == 0)
          l.stride = 1;
        const uint64_t hp = uint64_t{in.h} + 2 * l.padding, wp = uint64_t{in.w} + 2 * l.padding;
        if (hp < l.kernel || wp < l.kernel)
          return refuse("kernel " + std::to_string(l.kernel) + " with padding " + std::to_string(l.padding)
                        + " does not fit");
        if (l.padding >= l.kernel)
          return bad(where + ": conv2d padding " + std::to_string(l.padding) + " must be below the kernel "
                     + std::to_string(l.kernel));
        n.out = tensor_shape{l.out, static_cast<uint32_t>((hp - l.kernel) / l.stride + 1),
                             static_cast<uint32_t>((wp - l.kernel) / l.stride + 1)};
        n.fan_in = uint64_t{in.c} * l.kernel * l.kernel;
        n.weight_size = uint64_t{l.out} * n.fan_in;
        n.bias_size = l.out;
        break;
      }
      case layer_kind::maxpool:
      case layer_kind::avgpool: {
        if (l.kernel == 0)
          l.kernel = 2;
        if (l.stride == 0)
          l.stride = l.kernel;
        if (l.padding * 2 > l.kernel)
          return bad(where + ": " + to_string(l.kind) + " padding " + std::to_string(l.padding)
                     + " must be at most half the kernel " + std::to_string(l.kernel));
        const uint64_t hp = uint64_t{in.h} + 2 * l.padding, wp = uint64_t{in.w} + 2 * l.padding;
        if (hp < l.kernel || wp < l.kernel)
          return refuse("kernel " + std::to_string(l.kernel) + " does not fit");
        n.out = tensor_shape{in.c, static_cast<uint32_t>((hp - l.kernel) / l.stride + 1),
                             static_cast<uint32_t>((wp - l.kernel) / l.stride + 1)};
        break;
      }
      case layer_kind::relu:
        n.out = in;
        break;
      case layer_kind::flatten:
        if (in.size() > UINT32_MAX)
          return refuse("output is over 2^32 features");
        n.out = tensor_shape{static_cast<uint32_t>(in.size()), 1, 1};
        break;
      case layer_kind::dropout:
        if (!(l.p >= 0 && l.p < 1))
          return bad(where + ": dropout p " + show_real(l.p) + " must be in [0, 1)");
        n.out = in;
        break;
      case layer_kind::groupnorm:
        if (l.layernorm)
          l.groups = 1;
        if (l.groups == 0 || in.c % l.groups != 0)
          return refuse("groups " + std::to_string(l.groups) + " must divide the channels");
        if (in.size() / l.groups < 2)
          return refuse("needs at least 2 values per group");
        if (!(l.eps > 0))
          return bad(where + ": groupnorm eps must be > 0");
        n.out = in;
        n.weight_size = in.c;
        n.bias_size = in.c;
        break;
      case layer_kind::add: {
        auto it = by_name.find(l.from);
        if (l.from.empty() || (it == by_name.end() && l.from != "input"))
          return bad(where + ": add from '" + l.from + "' names no earlier layer");
        n.from = it == by_name.end() ? -1 : it->second;
        const auto other = n.from < 0 ? spec.input : plan.nodes[static_cast<size_t>(n.from)].out;
        if (other != in)
          return bad(where + ": add needs equal shapes, got input " + in.to_string() + " and '" + l.from + "' "
                     + other.to_string());
        n.out = in;
        break;
      }
      case layer_kind::external:
        if (l.params == 0)
          return bad(where + ": external needs params > 0 (the host backend's parameter count)");
        if (l.out == 0)
          l.out = spec.classes;
        n.out = tensor_shape{l.out, 1, 1};
        n.weight_size = l.params;
        break;
    }
    if (n.out.size() == 0)
      return bad(where + ": output shape " + n.out.to_string() + " is empty");
    n.weight = pos;
    pos += n.weight_size;
    n.bias = pos;
    pos += n.bias_size;
    if (pos > max_params)
      return bad(where + ": the model has over 2^32 parameters");
    plan.widest = std::max(plan.widest, n.out.size());
    plan.activation_floats += n.out.size();
    by_name[l.name] = static_cast<int>(i);
    plan.nodes.push_back(std::move(n));
  }
  plan.widest = std::max(plan.widest, spec.input.size());
  plan.num_params = pos;
  const auto& last = plan.nodes.back();
  if (last.out != tensor_shape{spec.classes, 1, 1})
    return bad("model.layers[" + std::to_string(plan.nodes.size() - 1) + "] '" + last.spec.name
               + "': the last layer's output must be the " + std::to_string(spec.classes)
               + " classes (softmax cross-entropy), got " + last.out.to_string());
  if (plan.num_params == 0)
    return bad("the model has no parameters");
  return plan;
}

caf::error refuse_external(const model_plan& plan, const std::string& backend) {
  for (size_t i = 0; i < plan.nodes.size(); ++i)
    if (plan.nodes[i].spec.kind == layer_kind::external)
      return make_error(errc::unknown_name, "model.layers[" + std::to_string(i) + "] '" + plan.nodes[i].spec.name
                                              + "' is an external layer: only a host application's own backend "
                                                "computes it (worker_config::make_backend), "
                                              + backend + " cannot");
  return caf::none;
}

caf::error validate(const model_spec& spec) {
  auto p = compile(spec);
  return p ? caf::none : p.error();
}

uint64_t model_spec::num_params() const {
  auto p = compile(*this);
  return p ? p->num_params : 0;
}

std::string model_spec::to_string() const {
  if (auto m = as_mlp())
    return m->to_string();
  std::string s = input.to_string() + " ";
  auto layers_now = resolved();
  for (size_t i = 0; i < layers_now.size(); ++i)
    s += (i ? "-" : "") + std::string{layers_now[i].layernorm ? "layernorm" : ashlar::to_string(layers_now[i].kind)};
  return s;
}

std::optional<mlp_spec> model_spec::as_mlp() const {
  auto plan = compile(*this);
  if (!plan)
    return std::nullopt;
  mlp_spec m;
  m.input = static_cast<uint32_t>(input.size());
  m.classes = classes;
  m.hidden.clear();
  const auto& nodes = plan->nodes;
  size_t i = 0;
  if (i < nodes.size() && nodes[i].spec.kind == layer_kind::flatten)
    ++i;
  // dense relu dense relu ... dense, each taking the previous output.
  for (; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    if (n.input != static_cast<int>(i) - 1 || n.spec.kind != layer_kind::dense)
      return std::nullopt;
    if (i + 1 == nodes.size())
      return m;
    const auto& r = nodes[i + 1];
    if (r.spec.kind != layer_kind::relu || r.input != static_cast<int>(i))
      return std::nullopt;
    m.hidden.push_back(n.spec.out);
    ++i;
  }
  return std::nullopt;
}

model_spec from_mlp(const mlp_spec& mlp) {
  model_spec m;
  m.input = mlp.input == 784 ? tensor_shape{1, 28, 28} : tensor_shape{mlp.input, 1, 1};
  m.classes = mlp.classes;
  m.hidden = mlp.hidden;
  return m;
}

std::vector<float> init_params(const model_spec& spec, uint64_t seed) {
  auto plan = compile(spec);
  if (!plan)
    return {};
  std::vector<float> p(plan->num_params, 0.0f);
  std::mt19937_64 gen{seed};
  // Box-Muller on the raw generator: std::normal_distribution's algorithm is not pinned
  // by the standard, this is, so the bits do not depend on the library. The same draws,
  // in the same order, as init_params(mlp_spec) for an MLP.
  auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 0.5) * 0x1.0p-53; };
  auto normal = [&](double stddev) {
    double u1 = uniform(), u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2) * stddev);
  };
  for (const auto& n : plan->nodes) {
    switch (n.spec.kind) {
      case layer_kind::dense:
      case layer_kind::conv2d: {
        double stddev = std::sqrt(2.0 / static_cast<double>(n.fan_in));
        for (uint64_t i = 0; i < n.weight_size; ++i)
          p[n.weight + i] = normal(stddev);
        break;
      }
      case layer_kind::groupnorm:
        std::fill(p.begin() + static_cast<std::ptrdiff_t>(n.weight),
                  p.begin() + static_cast<std::ptrdiff_t>(n.weight + n.weight_size), 1.0f);
        break;
      case layer_kind::external:
        for (uint64_t i = 0; i < n.weight_size; ++i)
          p[n.weight + i] = normal(0.01);
        break;
      default:
        break;
    }
  }
  return p;
}

}  // namespace ashlar
