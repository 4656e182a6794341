// The policies' settings as the configuration holds them (keys train.staleness_*, train.k,
// ashl.*): plain structs, each field with its default, read by the policies in
// runtime/policy. The configuration depends on no policy; the policies on this.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/error.hpp"

namespace ashlar {

/// Settings every policy may read. Each field documents its default.
struct policy_config {
  /// ASP: scale the learning rate by 1 / (1 + staleness). Default: false.
  bool staleness_aware_lr = false;
  /// SSP: how many clocks (pushes) a worker may run ahead of the slowest. Default: 3.
  uint64_t staleness_bound = 3;
  /// ksync / kasync: gradients per update; 0 = half the live workers, rounded up. Default: 0.
  uint32_t k = 0;
};

/// ashl.rule: AHL -> SHL on a loss plateau, or at a target loss.
enum class ashl_rule : uint8_t { plateau, loss };

/// "plateau" or "loss"; fails with invalid_config naming ashl.rule.
[[nodiscard]] expected<ashl_rule> parse_ashl_rule(const std::string& name);
const char* to_string(ashl_rule r);

/// ASHL's settings (config section [ashl], keys ashl.*). Each says its default.
struct ashl_config {
  /// Profiling: steps every live worker completes before the first plan. Default: 5.
  uint32_t profile_steps = 5;
  /// AHL: local steps of the slowest worker per commit; faster ones take more, so every
  /// worker's H_i x t_i + comm_i matches the slowest's. Default: 2.
  uint32_t ahl_local_steps = 2;
  /// AHL: commits a worker may run ahead of the slowest. Default: 16.
  uint64_t ahl_gap = 16;
  /// SHL: local steps of the slowest worker per commit. Default: 1.
  uint32_t shl_local_steps = 1;
  /// SHL: commits a worker may run ahead of the slowest. Default: 2.
  uint64_t shl_gap = 2;
  /// SHL: the learning rate (the shards' and the workers' local one) times this: the fine
  /// stage takes smaller steps. Default: 0.5.
  double shl_lr_scale = 0.5;
  /// Rule for AHL -> SHL: "plateau" (the training loss fell by less than plateau_drop,
  /// relatively, over the last plateau_window_epochs of training samples) or "loss" (the
  /// training loss is at most switch_loss). Default: "plateau".
  ashl_rule rule = ashl_rule::plateau;
  /// The plateau rule's window in epochs of training samples (all workers' together), as
  /// a learning-rate scheduler's patience counts epochs: the loss falls with the samples
  /// trained, so a cluster twice as fast reaches the same plateau in half the seconds and
  /// is judged over half the seconds. (A window of fixed seconds judges a fast cluster's
  /// loss over several times the samples: at speeds 6,7,8,5,1,2,8 a 1.5 s window held
  /// AHL until 2.0 s to 85%, against 1.5 s with a window in samples. Over three profiles,
  /// 3 seeds each, windows of 0.1, 0.2, 0.35 and 0.5 epochs summed 8.8, 8.1, 9.1 and
  /// 11.1 s to 85%; switching at once, 11.8 s.) Default: 0.25 (15K samples of
  /// Fashion-MNIST).
  double plateau_window_epochs = 0.25;
  /// The plateau window in seconds instead, when above 0. Default: 0.
  double plateau_window_s = 0;
  /// Default: 0.1 (10%).
  double plateau_drop = 0.1;
  /// Default: 0.45.
  double switch_loss = 0.45;
  /// Communication may take at most this share of the slowest worker's commit period:
  /// where a commit costs more than that allows (a slow network), the slowest worker
  /// takes more local steps than its stage's H, and the others follow. 1 = no limit.
  /// Default: 0.25.
  double max_comm_share = 0.25;
  /// Most local steps per commit. Default: 64.
  uint32_t max_local_steps = 64;
  /// Pushes in both stages carry this fraction of the gradient (top-k with error
  /// feedback); 0 = dense. train.topk_ratio, when set, wins. Default: 0.1.
  double topk_ratio = 0.1;
  /// Pull compression: after profiling, if communication takes at least
  /// pull_compress_above of the slowest worker's compute per step (measured while every
  /// step commits), pulls in AHL and SHL are delta reads of this fraction of each range
  /// (the entries that changed most, the rest sent later: error feedback); otherwise
  /// they stay dense. 0 = always dense. train.pull_topk_ratio, when set, wins. Default: 0.1.
  double pull_topk_ratio = 0.1;
  /// Default: 0 (pulls are compressed in both stages whatever the network, as pushes
  /// are: a dense pull carries 5 times a compressed push, so without it ASHL's frequent
  /// commits move more bytes than ADSP's rare dense ones. On a fast local network dense
  /// pulls reach a target about 10% sooner: 0.25 keeps them dense unless communication
  /// is a quarter of the slowest step's compute).
  double pull_compress_above = 0;
};

}  // namespace ashlar
