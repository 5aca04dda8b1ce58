#include "cpu/thread_pool.hpp"

#include <algorithm>
#include <system_error>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qkv::codegen::cpu {

namespace {

/// Spins until done() or kSpin has passed; returns done().
template <class Done>
bool spin_until(const Done& done) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() - t0 > ThreadPool::kSpin) return done();
#if defined(__x86_64__)
    _mm_pause();
#endif
  }
}

}  // namespace

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::shared() {
  static ThreadPool pool;
  return pool;
}

namespace {
thread_local bool in_job = false;  // this thread is running a job's tasks, or waiting for one
struct InJob {
  InJob() { in_job = true; }
  ~InJob() { in_job = false; }
  InJob(const InJob&) = delete;
  InJob& operator=(const InJob&) = delete;
};
}  // namespace

void ThreadPool::run(std::int64_t n, int threads, const std::function<void(std::int64_t)>& task) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> job(run_mutex_);
  run_locked(n, threads, task);
}

bool ThreadPool::try_run(std::int64_t n, int threads, const std::function<void(std::int64_t)>& task) {
  if (in_job) return false;
  std::unique_lock<std::mutex> job(run_mutex_, std::try_to_lock);
  if (!job.owns_lock()) return false;
  if (n > 0) run_locked(n, threads, task);
  return true;
}

int ThreadPool::module_hook(void (*body)(void*, std::int64_t), void* ctx, std::int64_t n, int threads) {
  // Called from generated code: nothing may be thrown through it. The tasks throw nothing, so an
  // exception can only come before the first one ran: the region then runs on its own threads.
  try {
    return shared().try_run(n, threads, [&](std::int64_t i) { body(ctx, i); }) ? 0 : 1;
  } catch (...) {
    return 1;
  }
}

void ThreadPool::run_locked(std::int64_t n, int threads, const std::function<void(std::int64_t)>& task) {
  const InJob caller;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int helpers = static_cast<int>(std::min<std::int64_t>(threads - 1, n - 1));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (static_cast<int>(workers_.size()) < helpers) {
      const int index = static_cast<int>(workers_.size());
      try {
        workers_.emplace_back([this, index] { worker(index); });
      } catch (const std::system_error&) {  // no thread to be had (ulimit, memory): fewer helpers
        helpers = index;
      }
    }
    task_ = &task;
    count_ = n;
    next_ = 0;
    error_ = nullptr;
    helpers_ = helpers;
    active_ = helpers;
    running_.store(helpers, std::memory_order_relaxed);
    ++generation_;
    posted_.store(generation_, std::memory_order_release);
  }
  if (helpers > 0) wake_.notify_all();
  drain();
  spin_until([&] { return running_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return active_ == 0; });
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::drain() {
  for (;;) {
    std::int64_t i;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_ >= count_) return;
      i = next_++;
    }
    try {
      (*task_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker(int index) {
  const InJob worker;  // a pool thread only ever runs the pool's tasks
  std::uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return posted_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && index < helpers_); });
      if (stop_) return;
      seen = generation_;
    }
    drain();
    std::lock_guard<std::mutex> lock(mutex_);
    running_.fetch_sub(1, std::memory_order_release);
    if (--active_ == 0) done_.notify_all();
  }
}

}  // namespace qkv::codegen::cpu
