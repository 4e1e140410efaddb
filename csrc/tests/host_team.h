// A Team (csrc/team_rows.h) of std::threads: runs the CUDA kernels' per-row algorithms on the host,
// one thread per rank, with barriers in place of warp shuffles and ballots.  Counts the team-wide
// collectives, so that tests can bound the work of an algorithm (passes over the row).
#pragma once

#include <array>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace sopfast::test {

struct HostTeamState {
  explicit HostTeamState(int team_size) : size(team_size), barrier(team_size), slots(team_size) {}
  int size;
  std::barrier<> barrier;
  std::vector<std::array<unsigned char, 8>> slots;  // one value per rank
  std::atomic<int64_t> collectives{0};
};

class HostTeam {
 public:
  HostTeam(HostTeamState& state, int rank) : state_(&state), rank_(rank) {}

  int rank() const { return rank_; }
  int size() const { return state_->size; }
  template <typename T>
  T sum(T v) const {
    return reduce(v, [](T a, T b) { return a + b; });
  }
  template <typename T>
  T max(T v) const {
    return reduce(v, [](T a, T b) { return b > a ? b : a; });
  }
  int count(bool flag) const { return sum<int>(flag ? 1 : 0); }
  int count_before(bool flag) const {
    publish(flag ? 1 : 0);
    int before = 0;
    for (int r = 0; r < rank_; ++r) before += read<int>(r);
    finish();
    return before;
  }
  void sync() const { state_->barrier.arrive_and_wait(); }

 private:
  template <typename T>
  void publish(T v) const {
    static_assert(sizeof(T) <= 8, "values of at most 8 bytes");
    std::memcpy(state_->slots[rank_].data(), &v, sizeof(T));
    state_->barrier.arrive_and_wait();
  }
  template <typename T>
  T read(int r) const {
    T v;
    std::memcpy(&v, state_->slots[r].data(), sizeof(T));
    return v;
  }
  void finish() const {
    if (rank_ == 0) ++state_->collectives;
    state_->barrier.arrive_and_wait();  // every rank has read the slots: they may be reused
  }
  template <typename T, typename Op>
  T reduce(T v, Op op) const {
    publish(v);
    T total = read<T>(0);
    for (int r = 1; r < state_->size; ++r) total = op(total, read<T>(r));
    finish();
    return total;
  }

  HostTeamState* state_;
  int rank_;
};

// Runs body(team) on team_size threads, one per rank; returns the number of team collectives.
template <typename Body>
int64_t run_host_team(int team_size, Body body) {
  HostTeamState state(team_size);
  std::vector<std::thread> threads;
  threads.reserve(team_size);
  for (int r = 0; r < team_size; ++r) threads.emplace_back([&state, &body, r] { body(HostTeam(state, r)); });
  for (auto& thread : threads) thread.join();
  return state.collectives.load();
}

}  // namespace sopfast::test
