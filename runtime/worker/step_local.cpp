// The step machine's local steps (adsp, ashl): the local model, the open commit, and
// overlapped commits whose pull lands behind the steps taken since.
#include "runtime/worker/step_machine.hpp"

#include <algorithm>

#include "runtime/optim/local_steps.hpp"

#include <spdlog/spdlog.h>

namespace ashlar {

// The learning rate of local steps, the stage's factor included.
float step_machine::local_lr() const {
  return job_.local_lr * local_lr_scale_ * schedule_lr_scale_;
}

// A local step: the step's gradient moves the local model (where the backend keeps the
// model, the step did).
void step_machine::step_local_model() {
  if (!held_step_)
    local_steps::move(params_.data(), grad_.data(), local_lr(), n_params_);
}

// Closes the open commit: its summed gradients times commit_scale go into `out` (the
// buffer its push reads), and the next commit starts empty. Where the backend keeps the
// model, it holds the sum: the commit is taken from it (with the velocity, when local
// steps end here, so steps on the worker's side go on from it), and the pushes wait for
// on_commit_taken. Returns whether `out` holds the commit now.
bool step_machine::take_commit(std::vector<float>& out) {
  const float scale = job_.commit_scale;
  // (A commit of steps that trained nothing, a script waiting for its peers, counts as one
  // sample: a shard takes no push of none.)
  push_samples_ = std::max<uint32_t>(acc_samples_, 1);
  acc_samples_ = 0;
  local_done_ = 0;
  if (!held_ || commit_on_host_) {
    out.resize(acc_.size());
    local_steps::take(out.data(), acc_.data(), scale, acc_.size());
    commit_on_host_ = false;
    return true;
  }
  out.resize(n_params_);
  step::take_commit t{out.data(), scale};
  if (mode_ != step_mode::local_steps && job_.local_momentum > 0) {
    local_velocity_.resize(n_params_);
    t.velocity_out = local_velocity_.data();
    velocity_on_host_ = true;
  }
  emit(t);
  return false;
}

void step_machine::on_commit_taken(const caf::error& err) {
  if (stopped_)
    return;
  if (err)
    return fail("taking the commit from the compute backend: " + describe(err));
  send_pushes();
  if (end_on_take_) { // an overlapped commit: its step ends once its pushes are out
    end_on_take_ = false;
    end_local_step();
  }
}

// With local steps in force, a step's gradient (its velocity, with local_momentum) is
// applied locally and added to the commit; the commit (the summed gradients) is pushed
// after local_steps steps, or at the last step. Otherwise the gradient is pushed at once
// (with a commit still open from local steps, as its last step).
void step_machine::after_compute() {
  if (mode_ == step_mode::ring)
    return ring_begin(); // (waits if the ring is not formed yet)
  if (job_.local_momentum > 0 && !held_step_) {
    // The worker's own momentum: from here on the step's update is its velocity.
    if (local_velocity_.size() != grad_.size())
      local_velocity_.assign(grad_.size(), 0.0f);
    local_steps::apply_momentum(grad_.data(), local_velocity_.data(), job_.local_momentum, grad_.size());
  }
  const uint32_t h = mode_ == step_mode::local_steps ? local_steps_ : 1;
  const bool overlap = job_.overlap_commits && mode_ == step_mode::local_steps;
  // (A step where the backend keeps the model added its update to the commit there.)
  if (!overlap && h <= 1 && local_done_ == 0 && !held_step_) {
    // Stopped while computing: the gradient is dropped, not pushed. The job's model is the
    // shards' at its stop, not one the slowest workers' last, stalest gradients move alone
    // once the others have left (asynchronous shards apply them one by one).
    if (stop_requested_)
      return finish();
    push_samples_ = std::max<uint32_t>(batch_n_, 1);
    if (job_.commit_scale != 1.0f)
      for (auto& g : grad_)
        g *= job_.commit_scale;
    return send_pushes();
  }
  if (!held_step_) {
    if (acc_.size() != grad_.size())
      acc_.assign(grad_.size(), 0.0f);
    local_steps::accumulate(acc_.data(), grad_.data(), grad_.size());
    commit_on_host_ = held_; // (where the backend keeps the model: its next step takes this along)
  } else if (commit_handed_) {
    std::fill(acc_.begin(), acc_.end(), 0.0f); // the backend has it now
    commit_handed_ = false;
  }
  acc_samples_ += batch_n_;
  ++local_done_;
  bool last = step_ + 1 >= job_.steps || stop_requested_;
  if (overlap) {
    // Every step moves the local model, a committing one too: the commit's pull comes
    // back later and takes the steps made meanwhile along (commit_landed).
    step_local_model();
    if (local_done_ >= h || last) {
      if (commit_inflight_) {
        // The last commit is still on its way: this step ends when it has landed.
        commit_due_ = true;
        due_since_ = clock_.steady_ns();
        return;
      }
      if (!begin_commit()) {
        end_on_take_ = true; // on_commit_taken ends the step
        return;
      }
    }
    return end_local_step();
  }
  if (local_done_ >= h || last) {
    if (take_commit(grad_))
      send_pushes();
    return;
  }
  // A local step: move the local model and go on without talking to the shards.
  step_local_model();
  report_step(0);
  end_step();
}

// Overlapped commits: sends the summed gradients of the steps since the last commit and
// goes on computing; the push's acknowledgements start the pull (phase_done), and the
// pull lands in commit_landed.
bool step_machine::begin_commit() {
  commit_inflight_ = true;
  model_local_ = true;
  pulled_.resize(n_params_);
  if (!take_commit(commit_))
    return false; // on_commit_taken sends them
  send_pushes();
  return true;
}

// The step is done; time spent waiting for a commit in flight counts as its push time.
void step_machine::end_local_step() {
  report_step(exposed_ns_);
  exposed_ns_ = 0;
  end_step();
}

// The pull after an overlapped commit is here: the local model is the pulled one minus
// the local steps taken since the commit (lr x their summed gradients, in acc). A step
// that waited for it (its commit due, a change of mode, or the finish) goes on.
void step_machine::commit_landed() {
  if (held_ && !commit_on_host_) {
    emit(step::rebase{pulled_.data(), local_lr()});
  } else {
    local_steps::rebase(params_.data(), pulled_.data(), acc_.data(), local_lr(), n_params_);
    held_current_ = false;
  }
  commit_inflight_ = false;
  if (commit_due_) {
    commit_due_ = false;
    exposed_ns_ += since(due_since_);
    if (!begin_commit()) {
      end_on_take_ = true;
      return;
    }
    return end_local_step();
  }
  if (deferred_step_) {
    deferred_step_ = false;
    emit(step::next_step{});
  }
}

}  // namespace ashlar
