// SIGBUS under the CLI's handlers (tools/qkv/out_of_memory.hpp): a checkpoint truncated by another
// process while its weights are read in place (a window onto the file: SafetensorsFile::load) is
// one line and exit 1, not a core dump.
#include "out_of_memory.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <qkv/runtime/io/safetensors.hpp>

namespace {

namespace fs = std::filesystem;

TEST(BusError, ACheckpointTruncatedUnderItsWindowsIsOneLineAndExit1) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const fs::path dir = fs::temp_directory_path() / ("qkv_bus_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path p = dir / "model.safetensors";
  qkv::write_safetensors(p, {{"w", qkv::NdArray::zeros(qkv::DType::f32, {1 << 16})}});  // 256 KiB
  EXPECT_EXIT(
      {
        qkv::cli::install_out_of_memory_handlers();
        const qkv::SafetensorsFile f = qkv::SafetensorsFile::open(p);
        qkv::NdArray w = f.load("w");
        if (!w.bytes.is_window()) std::_Exit(2);
        if (::truncate(p.c_str(), 0) != 0) std::_Exit(3);
        volatile float x = w.as<float>()[std::size_t{1} << 15];  // a page past the file's new end
        (void)x;
        std::_Exit(4);
      },
      ::testing::ExitedWithCode(1), "^qkv: error: a file mapped into memory was truncated by another process");
  fs::remove_all(dir);
}

}  // namespace
