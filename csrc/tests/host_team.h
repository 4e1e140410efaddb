// A Team (csrc/team_rows.h) of std::threads: runs the CUDA kernels' per-row algorithms on the host,
// one thread per rank in groups of `lanes` (as warps), with barriers in place of warp shuffles and
// ballots.  Counts the team-wide collectives (block barriers on the GPU) apart from the ballots
// (within a warp), so that tests can bound the work of an algorithm.
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
  HostTeamState(int team_size, int group_lanes)
      : size(team_size), lanes(group_lanes), barrier(team_size), slots(team_size) {}
  int size;
  int lanes;  // threads per group, at most 32
  std::barrier<> barrier;
  std::vector<std::array<unsigned char, 8>> slots;  // one value per rank
  std::atomic<int64_t> collectives{0};
  std::atomic<int64_t> ballots{0};
};

class HostTeam {
 public:
  HostTeam(HostTeamState& state, int rank) : state_(&state), rank_(rank) {}

  int rank() const { return rank_; }
  int size() const { return state_->size; }
  int lanes() const { return state_->lanes; }
  int group() const { return rank_ / state_->lanes; }
  int lane() const { return rank_ % state_->lanes; }
  template <typename T>
  T sum(T v) const {
    return reduce(v, [](T a, T b) { return a + b; });
  }
  template <typename T>
  T max(T v) const {
    return reduce(v, [](T a, T b) { return b > a ? b : a; });
  }
  uint32_t ballot(bool flag) const {
    publish<int>(flag ? 1 : 0);
    uint32_t bits = 0;
    const int first = group() * lanes();
    for (int l = 0; l < lanes() && first + l < size(); ++l) bits |= read<int>(first + l) ? (1u << l) : 0u;
    finish(state_->ballots);
    return bits;
  }
  int groups_before(int count, int* total) const {
    publish(count);
    int before = 0, all = 0;
    for (int r = 0; r < size(); r += lanes()) {
      all += read<int>(r);
      before += r < group() * lanes() ? read<int>(r) : 0;
    }
    finish(state_->collectives);
    *total = all;
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
  void finish(std::atomic<int64_t>& counter) const {
    if (rank_ == 0) ++counter;
    state_->barrier.arrive_and_wait();  // every rank has read the slots: they may be reused
  }
  template <typename T, typename Op>
  T reduce(T v, Op op) const {
    publish(v);
    T total = read<T>(0);
    for (int r = 1; r < state_->size; ++r) total = op(total, read<T>(r));
    finish(state_->collectives);
    return total;
  }

  HostTeamState* state_;
  int rank_;
};

// The counts of one run_host_team: team-wide collectives and ballots.
struct HostTeamWork {
  int64_t collectives = 0;
  int64_t ballots = 0;
};

// Runs body(team) on team_size threads, one per rank, in groups of `lanes` (default: one warp, or
// the whole team when smaller).
template <typename Body>
HostTeamWork run_host_team(int team_size, Body body, int lanes = 32) {
  HostTeamState state(team_size, lanes < team_size ? lanes : team_size);
  std::vector<std::thread> threads;
  threads.reserve(team_size);
  for (int r = 0; r < team_size; ++r) threads.emplace_back([&state, &body, r] { body(HostTeam(state, r)); });
  for (auto& thread : threads) thread.join();
  return {state.collectives.load(), state.ballots.load()};
}

}  // namespace sopfast::test
