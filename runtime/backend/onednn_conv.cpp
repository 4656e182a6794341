#include "runtime/backend/onednn_conv.hpp"

#include <stdexcept>

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

namespace ashlar::cpu {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

memory::dim dim(uint64_t v) {
  return static_cast<memory::dim>(v);
}

}  // namespace

struct onednn_conv::engine {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
};

// Everything that depends on the batch size: the primitives oneDNN picked for it, the
// blocked buffers they read and write, and the reorders between those and the caller's
// plain buffers (user memories whose handles are set on every call).
struct onednn_conv::batch {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd;
  dnnl::convolution_backward_data::primitive_desc bwd_d_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_weights bwd_w;
  dnnl::convolution_backward_data bwd_d;
  // Plain (caller's) memories.
  memory x, y, dy, dx, w, dw, b, db;
  // oneDNN's layouts.
  memory src, dst, diff_dst, diff_dst_d, diff_src, wei, wei_d, diff_wei;
  dnnl::reorder x_in, y_out, dy_in, dy_in_d, dx_out, dx_add, w_in, w_in_d, dw_out;
};

onednn_conv::onednn_conv(const plan_node& layer) : layer_(layer), engine_(std::make_unique<engine>()) {
  for_batch(1); // fails here, not mid-training, if oneDNN cannot build this shape
}

onednn_conv::~onednn_conv() = default;

onednn_conv::batch& onednn_conv::for_batch(size_t n) {
  if (auto it = batches_.find(n); it != batches_.end())
    return *it->second;
  // Batch sizes change under adaptive allocation: keep a few.
  if (batches_.size() >= 6)
    batches_.erase(batches_.begin());
  const auto& l = layer_;
  const auto& eng = engine_->eng;
  const int64_t k = l.spec.kernel, s = l.spec.stride, p = l.spec.padding;
  // The right/bottom padding that gives the planned output size exactly (negative where
  // the stride leaves the last rows or columns unread).
  const int64_t pr_h = (int64_t{l.out.h} - 1) * s + k - l.in.h - p;
  const int64_t pr_w = (int64_t{l.out.w} - 1) * s + k - l.in.w - p;
  const memory::dims src_dims{dim(n), dim(l.in.c), dim(l.in.h), dim(l.in.w)};
  const memory::dims dst_dims{dim(n), dim(l.out.c), dim(l.out.h), dim(l.out.w)};
  const memory::dims wei_dims{dim(l.out.c), dim(l.in.c), k, k};
  const memory::dims bias_dims{dim(l.out.c)};
  const memory::dims strides{s, s}, pad_l{p, p}, pad_r{pr_h, pr_w};
  const memory::desc src_any(src_dims, dt::f32, tag::any), dst_any(dst_dims, dt::f32, tag::any),
    wei_any(wei_dims, dt::f32, tag::any), bias_md(bias_dims, dt::f32, tag::x);
  const memory::desc src_plain(src_dims, dt::f32, tag::nchw), dst_plain(dst_dims, dt::f32, tag::nchw),
    wei_plain(wei_dims, dt::f32, tag::oihw);

  auto B = std::make_unique<batch>();
  try {
    B->fwd_pd = {{dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_any, wei_any, bias_md,
                  dst_any, strides, pad_l, pad_r},
                 eng};
    B->bwd_w_pd = {{dnnl::algorithm::convolution_direct, src_any, wei_any, bias_md, dst_any, strides, pad_l, pad_r},
                   eng, B->fwd_pd};
    B->bwd_d_pd = {{dnnl::algorithm::convolution_direct, src_any, wei_any, dst_any, strides, pad_l, pad_r}, eng,
                   B->fwd_pd};
    B->fwd = dnnl::convolution_forward(B->fwd_pd);
    B->bwd_w = dnnl::convolution_backward_weights(B->bwd_w_pd);
    B->bwd_d = dnnl::convolution_backward_data(B->bwd_d_pd);

    B->x = memory(src_plain, eng, DNNL_MEMORY_NONE);
    B->y = memory(dst_plain, eng, DNNL_MEMORY_NONE);
    B->dy = memory(dst_plain, eng, DNNL_MEMORY_NONE);
    B->dx = memory(src_plain, eng, DNNL_MEMORY_NONE);
    B->w = memory(wei_plain, eng, DNNL_MEMORY_NONE);
    B->dw = memory(wei_plain, eng, DNNL_MEMORY_NONE);
    B->b = memory(bias_md, eng, DNNL_MEMORY_NONE);
    B->db = memory(bias_md, eng, DNNL_MEMORY_NONE);

    B->src = memory(B->fwd_pd.src_desc(), eng);
    B->dst = memory(B->fwd_pd.dst_desc(), eng);
    B->wei = memory(B->fwd_pd.weights_desc(), eng);
    B->diff_dst = memory(B->bwd_w_pd.diff_dst_desc(), eng);
    B->diff_wei = memory(B->bwd_w_pd.diff_weights_desc(), eng);
    B->diff_dst_d = B->bwd_d_pd.diff_dst_desc() == B->bwd_w_pd.diff_dst_desc()
                      ? B->diff_dst
                      : memory(B->bwd_d_pd.diff_dst_desc(), eng);
    B->wei_d = memory(B->bwd_d_pd.weights_desc(), eng);
    B->diff_src = memory(B->bwd_d_pd.diff_src_desc(), eng);
    if (B->bwd_w_pd.src_desc() != B->fwd_pd.src_desc())
      throw std::runtime_error("oneDNN: backward-weights wants another source layout");

    B->x_in = dnnl::reorder(B->x, B->src);
    B->y_out = dnnl::reorder(B->dst, B->y);
    B->dy_in = dnnl::reorder(B->dy, B->diff_dst);
    B->dy_in_d = dnnl::reorder(B->dy, B->diff_dst_d);
    B->w_in = dnnl::reorder(B->w, B->wei);
    B->w_in_d = dnnl::reorder(B->w, B->wei_d);
    B->dw_out = dnnl::reorder(B->diff_wei, B->dw);
    B->dx_out = dnnl::reorder(B->diff_src, B->dx);
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    dnnl::primitive_attr add;
    add.set_post_ops(sum);
    B->dx_add = dnnl::reorder(dnnl::reorder::primitive_desc(eng, B->diff_src.get_desc(), eng, B->dx.get_desc(), add));
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string{"oneDNN: "} + e.what());
  }
  return *batches_.emplace(n, std::move(B)).first->second;
}

void onednn_conv::forward(size_t n, const float* x, const float* w, const float* b, float* y) {
  auto& B = for_batch(n);
  auto& st = engine_->stream;
  B.x.set_data_handle(const_cast<float*>(x));
  B.w.set_data_handle(const_cast<float*>(w));
  B.b.set_data_handle(const_cast<float*>(b));
  B.y.set_data_handle(y);
  B.x_in.execute(st, B.x, B.src);
  B.w_in.execute(st, B.w, B.wei);
  B.fwd.execute(st, {{DNNL_ARG_SRC, B.src}, {DNNL_ARG_WEIGHTS, B.wei}, {DNNL_ARG_BIAS, B.b}, {DNNL_ARG_DST, B.dst}});
  B.y_out.execute(st, B.dst, B.y);
  st.wait();
  last_x_ = x;
  last_n_ = n;
}

void onednn_conv::backward(size_t n, const float* x, const float* w, const float* dy, float* dw, float* db, float* dx,
                           bool accumulate) {
  auto& B = for_batch(n);
  auto& st = engine_->stream;
  if (x != last_x_ || n != last_n_) {
    B.x.set_data_handle(const_cast<float*>(x));
    B.x_in.execute(st, B.x, B.src);
  }
  B.dy.set_data_handle(const_cast<float*>(dy));
  B.dw.set_data_handle(dw);
  B.db.set_data_handle(db);
  B.dy_in.execute(st, B.dy, B.diff_dst);
  B.bwd_w.execute(st, {{DNNL_ARG_SRC, B.src},
                       {DNNL_ARG_DIFF_DST, B.diff_dst},
                       {DNNL_ARG_DIFF_WEIGHTS, B.diff_wei},
                       {DNNL_ARG_DIFF_BIAS, B.db}});
  B.dw_out.execute(st, B.diff_wei, B.dw);
  if (dx) {
    if (B.diff_dst_d != B.diff_dst)
      B.dy_in_d.execute(st, B.dy, B.diff_dst_d);
    B.w.set_data_handle(const_cast<float*>(w));
    B.w_in_d.execute(st, B.w, B.wei_d);
    B.bwd_d.execute(st, {{DNNL_ARG_DIFF_DST, B.diff_dst_d}, {DNNL_ARG_WEIGHTS, B.wei_d}, {DNNL_ARG_DIFF_SRC, B.diff_src}});
    B.dx.set_data_handle(dx);
    (accumulate ? B.dx_add : B.dx_out).execute(st, B.diff_src, B.dx);
  }
  st.wait();
}

std::string onednn_conv::kernels() const {
  if (batches_.empty())
    return {};
  const auto& B = *batches_.rbegin()->second;
  return B.fwd_pd.impl_info_str();
}

void set_onednn_threads(int n) {
  omp_set_num_threads(n < 1 ? 1 : n);
}

}  // namespace ashlar::cpu
