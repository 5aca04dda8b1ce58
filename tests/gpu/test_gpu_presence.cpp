// GPU tests skip, with the reason, where no CUDA driver or GPU is present. The driver is loaded
// with dlopen by qkv::cuda (qkv/runtime/cuda.hpp), so this builds and runs on machines without CUDA.
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include <qkv/runtime/cuda.hpp>

namespace {

TEST(Gpu, DriverAndDeviceAreUsable) {
  const std::string reason = qkv::cuda::why_no_gpu();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const qkv::cuda::Device gpu = qkv::cuda::Device::open();
  const int v = gpu.driver().version();
  std::cout << "GPU 0: " << gpu.name() << ", compute capability " << gpu.cc_major() << "." << gpu.cc_minor() << " ("
            << gpu.arch() << "), " << gpu.sm_count() << " SMs, " << gpu.total_memory() / (1 << 20) << " MiB, "
            << gpu.max_shared_per_block_optin() / 1024 << " KiB shared memory per block (opt-in); driver CUDA "
            << v / 1000 << "." << v % 1000 / 10 << " (" << gpu.driver().path() << ", " << gpu.driver().device_count()
            << " GPU(s))\n";
  EXPECT_FALSE(gpu.name().empty());
  EXPECT_GE(gpu.cc_major(), 1);
  EXPECT_GT(gpu.sm_count(), 0);
  EXPECT_GT(gpu.total_memory(), 0u);
  EXPECT_GE(gpu.max_shared_per_block_optin(), 48 * 1024);
}

}  // namespace
