// codegen/cpu/thread_pool.hpp — a small persistent pool of std::threads for the CPU kernels
// (private). One job at a time; the calling thread takes part; tasks are handed out one by one
// from a shared counter, so uneven tasks (causal attention) balance themselves. A thread
// waiting for the next job, or for the helpers to finish one, spins for up to kSpin before it
// sleeps: waking a sleeping thread costs tens of microseconds on a virtual machine, more than a
// decode step's attention takes (measured: 2 threads slower than 1 below S = 2048 keys without).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qkv::codegen::cpu {

class ThreadPool {
 public:
  ThreadPool() = default;
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Calls task(i) for every i in [0, n), on up to `threads` threads (the caller's included;
  /// threads <= 0 means one per hardware thread). Returns when all are done; rethrows the first
  /// exception a task threw (the other tasks still run).
  void run(std::int64_t n, int threads, const std::function<void(std::int64_t)>& task);

  /// The same, unless the pool is running another job or the calling thread is inside one of its
  /// tasks (a nested region): then false, having run nothing.
  bool try_run(std::int64_t n, int threads, const std::function<void(std::int64_t)>& task);

  /// The generated modules' parallel hook (threads_ir.hpp): the shared pool's try_run.
  static int module_hook(void (*body)(void*, std::int64_t), void* ctx, std::int64_t n, int threads);

  /// The process-wide pool.
  static ThreadPool& shared();

  static constexpr std::chrono::microseconds kSpin{200};

 private:
  void worker(int index);
  void drain();
  void run_locked(std::int64_t n, int threads, const std::function<void(std::int64_t)>& task);

  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  std::uint64_t generation_ = 0;
  int helpers_ = 0;                       // workers [0, helpers_) take part in the current job
  int active_ = 0;                        // helpers still working on it
  std::atomic<std::uint64_t> posted_{0};  // generation_, readable without the lock (spinning)
  std::atomic<int> running_{0};           // active_, likewise
  const std::function<void(std::int64_t)>* task_ = nullptr;
  std::int64_t count_ = 0;
  std::int64_t next_ = 0;  // guarded by mutex_ (tasks are coarse: one lock per task is noise)
  std::exception_ptr error_;
};

}  // namespace qkv::codegen::cpu
