#include "runtime/predict/speed_predictor.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace ashlar {

void ewma_predictor::observe(double x) {
  s_ = seen_ ? alpha_ * x + (1 - alpha_) * s_ : x;
  seen_ = true;
}

namespace {

double sigmoid(double a) {
  return 1.0 / (1.0 + std::exp(-a));
}

}  // namespace

struct gru_predictor::step_cache {
  std::vector<double> h_prev, z, r, n, h;
  double x = 0, y = 0;
};

gru_predictor::gru_predictor(gru_config cfg) : cfg_(cfg) {
  const size_t h = cfg_.hidden;
  std::mt19937_64 rng{cfg_.seed};
  std::normal_distribution<double> d{0.0, 1.0 / std::sqrt(static_cast<double>(h))};
  auto init = [&](std::vector<double>& w, size_t n) {
    w.resize(n);
    for (auto& x : w)
      x = d(rng);
  };
  init(wz_, h);
  init(wr_, h);
  init(wn_, h);
  init(uz_, h * h);
  init(ur_, h * h);
  init(un_, h * h);
  init(v_, h);
  bz_.assign(h, 0.0);
  br_.assign(h, 0.0);
  bn_.assign(h, 0.0);
}

double gru_predictor::forward(const std::vector<double>& xs, std::vector<step_cache>* cache) const {
  const size_t H = cfg_.hidden;
  std::vector<double> h(H, 0.0), rh(H);
  double y = 0;
  for (double x : xs) {
    step_cache s;
    s.x = x;
    s.h_prev = h;
    s.z.resize(H);
    s.r.resize(H);
    s.n.resize(H);
    for (size_t i = 0; i < H; ++i) {
      double az = wz_[i] * x + bz_[i], ar = wr_[i] * x + br_[i];
      for (size_t j = 0; j < H; ++j) {
        az += uz_[i * H + j] * h[j];
        ar += ur_[i * H + j] * h[j];
      }
      s.z[i] = sigmoid(az);
      s.r[i] = sigmoid(ar);
    }
    for (size_t j = 0; j < H; ++j)
      rh[j] = s.r[j] * h[j];
    for (size_t i = 0; i < H; ++i) {
      double an = wn_[i] * x + bn_[i];
      for (size_t j = 0; j < H; ++j)
        an += un_[i * H + j] * rh[j];
      s.n[i] = std::tanh(an);
    }
    for (size_t i = 0; i < H; ++i)
      h[i] = (1 - s.z[i]) * s.n[i] + s.z[i] * h[i];
    y = c_;
    for (size_t i = 0; i < H; ++i)
      y += v_[i] * h[i];
    s.h = h;
    s.y = y;
    if (cache)
      cache->push_back(std::move(s));
  }
  return y;
}

// One gradient step on predicting xs[t + 1] from xs[0..t], t < size - 1 (truncated BPTT).
void gru_predictor::train_step(const std::vector<double>& xs) {
  if (xs.size() < 2)
    return;
  const size_t H = cfg_.hidden, T = xs.size();
  std::vector<step_cache> cache;
  forward(xs, &cache);
  std::vector<double> gwz(H), gwr(H), gwn(H), guz(H * H), gur(H * H), gun(H * H), gbz(H), gbr(H), gbn(H),
    gv(H);
  double gc = 0;
  std::vector<double> dh_next(H, 0.0), dh(H), dz(H), dn(H), daz(H), dar(H), dan(H), drh(H), dh_prev(H);
  const double scale = 2.0 / static_cast<double>(T - 1);
  for (size_t t = T - 1; t-- > 0;) {
    const auto& s = cache[t];
    double dy = scale * (s.y - xs[t + 1]);
    gc += dy;
    for (size_t i = 0; i < H; ++i) {
      gv[i] += dy * s.h[i];
      dh[i] = dy * v_[i] + dh_next[i];
    }
    for (size_t i = 0; i < H; ++i) {
      dz[i] = dh[i] * (s.h_prev[i] - s.n[i]);
      dn[i] = dh[i] * (1 - s.z[i]);
      dh_prev[i] = dh[i] * s.z[i];
      dan[i] = dn[i] * (1 - s.n[i] * s.n[i]);
      daz[i] = dz[i] * s.z[i] * (1 - s.z[i]);
    }
    std::fill(drh.begin(), drh.end(), 0.0);
    for (size_t i = 0; i < H; ++i) {
      gwn[i] += dan[i] * s.x;
      gbn[i] += dan[i];
      for (size_t j = 0; j < H; ++j) {
        gun[i * H + j] += dan[i] * s.r[j] * s.h_prev[j];
        drh[j] += un_[i * H + j] * dan[i];
      }
    }
    for (size_t j = 0; j < H; ++j) {
      dh_prev[j] += drh[j] * s.r[j];
      double dr = drh[j] * s.h_prev[j];
      dar[j] = dr * s.r[j] * (1 - s.r[j]);
    }
    for (size_t i = 0; i < H; ++i) {
      gwz[i] += daz[i] * s.x;
      gbz[i] += daz[i];
      gwr[i] += dar[i] * s.x;
      gbr[i] += dar[i];
      for (size_t j = 0; j < H; ++j) {
        guz[i * H + j] += daz[i] * s.h_prev[j];
        gur[i * H + j] += dar[i] * s.h_prev[j];
        dh_prev[j] += uz_[i * H + j] * daz[i] + ur_[i * H + j] * dar[i];
      }
    }
    dh_next = dh_prev;
  }
  // Clip the whole gradient to norm 1, then step.
  double norm2 = gc * gc;
  for (const auto* g : {&gwz, &gwr, &gwn, &guz, &gur, &gun, &gbz, &gbr, &gbn, &gv})
    for (double x : *g)
      norm2 += x * x;
  double k = cfg_.lr * std::min(1.0, 1.0 / std::max(1e-12, std::sqrt(norm2)));
  auto step = [k](std::vector<double>& w, const std::vector<double>& g) {
    for (size_t i = 0; i < w.size(); ++i)
      w[i] -= k * g[i];
  };
  step(wz_, gwz);
  step(wr_, gwr);
  step(wn_, gwn);
  step(uz_, guz);
  step(ur_, gur);
  step(un_, gun);
  step(bz_, gbz);
  step(br_, gbr);
  step(bn_, gbn);
  step(v_, gv);
  c_ -= k * gc;
}

void gru_predictor::observe(double x) {
  ++seen_;
  mean_ += (x - mean_) / static_cast<double>(std::min<uint64_t>(seen_, 100));
  window_.push_back(x);
  while (window_.size() > cfg_.window)
    window_.pop_front();
  const double m = mean_ != 0 ? mean_ : 1.0;
  std::vector<double> xs;
  for (double v : window_)
    xs.push_back(v / m - 1.0);
  for (uint32_t e = 0; e < cfg_.epochs; ++e)
    train_step(xs);
  prediction_ = (forward(xs, nullptr) + 1.0) * m;
}

}  // namespace ashlar
