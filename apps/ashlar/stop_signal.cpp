#include "apps/ashlar/stop_signal.hpp"
#include "apps/ashlar/host.hpp"

#include <atomic>
#include <csignal>

namespace ashlar::cli {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_second_aborts{false};
std::atomic<bool> g_seen{false};
std::atomic<bool> g_host_signals{false};

extern "C" void on_stop_signal(int sig) {
  if (g_second_aborts.load() && g_seen.exchange(true)) {
    std::signal(sig, SIG_DFL); // the second one: the default action, now
    std::raise(sig);
    return;
  }
  g_signal.store(sig);
}

}  // namespace

void catch_stop_signals(bool second_aborts) {
  if (g_host_signals.load())
    return; // the host takes them and calls request_stop
  g_second_aborts.store(second_aborts);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

int stop_signal() {
  return g_signal.load();
}

int take_stop_signal() {
  return g_signal.exchange(0);
}

void leave_signals_to_host() {
  g_host_signals.store(true);
}

void request_stop(int sig) {
  g_signal.store(sig);
}

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace ashlar::cli
