// How the kernels split work over threads: torch's OpenMP runtime where the build has OpenMP, else a
// small pool of our own threads (engine/kernels/build.py builds without OpenMP where the compiler has
// none: macOS's Apple clang). Without it the kernels would run on one thread there: at::parallel_for
// is inline in torch's headers and, in a translation unit compiled without OpenMP, runs its loop serially.
//
// parallel_for splits [begin, end) as at::parallel_for does (min(threads, ceil(n / grain)) equal chunks,
// torch's thread count), so each thread computes the same outputs in either build. run_team starts one
// team of `size` threads that all run at once (the fused step's barriers need that).
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>

#ifdef _OPENMP
#include <omp.h>
#else
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unistd.h>
#endif

namespace inferlab {

// A spinning thread's pause between checks (it frees the core's shared resources for its sibling).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

#ifdef _OPENMP
constexpr bool kOpenMP = true;

template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  at::parallel_for(begin, end, grain, f);
}

#else
constexpr bool kOpenMP = false;

// A team of worker threads kept between calls. One team runs at a time (a second caller waits for the
// first); a call from inside a team's work runs serially in its caller, as a nested at::parallel_for does.
// Workers wait for work spinning briefly (a decode step's products follow each other within
// microseconds), then yielding, then asleep on a condition variable.
class Pool {
 public:
  static Pool& get() {
    // Never destroyed: its detached workers may outlive static destructors. A child process after fork()
    // has none of the parent's threads (and maybe a lock the parent held): it starts a pool of its own.
    static Pool* pool = new Pool;
    if (pool->pid_ != getpid()) pool = new Pool;
    return *pool;
  }

  static bool inside() { return depth() > 0; }

  // How many worker threads this process's pool has started (the tests: work was split over them).
  int workers() {
    std::lock_guard<std::mutex> lock(run_mutex_);
    return workers_;
  }

  // Runs fn(tid, size) for tid 0..size-1 at once, tid 0 on the calling thread; rethrows the first
  // exception any of them threw, after all are done.
  void run(int size, const std::function<void(int, int)>& fn) {
    if (size <= 1 || inside()) {  // serial, in the caller: its exceptions propagate as they are
      fn(0, 1);
      return;
    }
    std::lock_guard<std::mutex> one_team(run_mutex_);
    while (workers_ < size - 1) start_worker();
    job_ = &fn;
    size_ = size;
    error_ = nullptr;
    // Every worker answers every call, those outside the team at once: none can lag a call behind and
    // read the next call's job as its own.
    pending_.store(workers_, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(wake_mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    call(fn, 0, size);
    for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
      if (i < 2000) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    job_ = nullptr;
    rethrow();
  }

 private:
  Pool() : pid_(getpid()) {}

  static int& depth() {
    thread_local int d = 0;
    return d;
  }

  void call(const std::function<void(int, int)>& fn, int tid, int size) {
    ++depth();
    try {
      fn(tid, size);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    --depth();
  }

  void rethrow() {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(error_mutex_);
      std::swap(e, error_);
    }
    if (e) std::rethrow_exception(e);
  }

  void start_worker() {
    const int tid = ++workers_;  // 1, 2, ...: the caller is 0
    const uint64_t seen = generation_.load(std::memory_order_acquire);
    std::thread([this, tid, seen] { work(tid, seen); }).detach();
  }

  void work(int tid, uint64_t seen) {
    for (;;) {
      uint64_t now = generation_.load(std::memory_order_acquire);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; now == seen; ++i) {
        if (i < 4096) {
          cpu_relax();
        } else if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2)) {
          std::this_thread::yield();
        } else {
          std::unique_lock<std::mutex> lock(wake_mutex_);
          wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        }
        now = generation_.load(std::memory_order_acquire);
      }
      seen = now;
      if (tid < size_) call(*job_, tid, size_);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::mutex run_mutex_, wake_mutex_, error_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  int workers_ = 0;  // under run_mutex_
  const std::function<void(int, int)>* job_ = nullptr;
  int size_ = 1;
  std::exception_ptr error_;
  pid_t pid_;
};

template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  const int64_t n = end - begin;
  int64_t threads = std::max(1, at::get_num_threads());
  if (grain > 0) threads = std::min(threads, (n + grain - 1) / grain);
  if (threads <= 1 || Pool::inside()) {
    f(begin, end);
    return;
  }
  const int64_t chunk = (n + threads - 1) / threads;
  Pool::get().run(static_cast<int>(threads), [&](int tid, int) {
    const int64_t b = begin + tid * chunk;
    if (b < end) f(b, std::min(end, b + chunk));
  });
}
#endif

// Runs fn(tid, size) on `size` threads at once (OpenMP's team, or the pool's); the team may be smaller
// than asked under OpenMP, so fn reads its size from its argument.
template <class F>
inline void run_team(int size, const F& fn) {
  if (size <= 1) {
    fn(0, 1);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(size)
  fn(omp_get_thread_num(), omp_get_num_threads());
#else
  Pool::get().run(size, [&](int tid, int team) { fn(tid, team); });
#endif
}

}  // namespace inferlab
