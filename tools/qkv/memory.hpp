// How much memory a command will need, from the shapes alone, checked against what the process
// can still get before anything large is allocated: a run that cannot fit is refused with one
// line, "this run needs about 12.0 GiB, more than the 3.1 GiB available" (exit 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <qkv/ir/graph.hpp>

#include "commands.hpp"

namespace qkv::cli {

/// Bytes the process can still allocate: the least of the system's MemAvailable (plus free
/// swap), the cgroup's memory.max minus memory.current, and RLIMIT_AS / RLIMIT_DATA minus what
/// the process has mapped already.
std::uint64_t memory_available();

/// The process's peak resident memory so far, in MiB.
double peak_rss_mib();

/// Throws std::runtime_error "<what> needs about X GiB, more than the Y GiB available" when
/// `bytes` exceeds memory_available().
void require_memory(std::uint64_t bytes, const std::string& what = "this run");

/// The bytes of each node's value under `sizes` (a node whose extents are not all bound — a
/// merge's fresh symbol — takes the largest of its inputs'). Throws UsageError when a value
/// would exceed 2^63 bytes.
std::vector<std::uint64_t> value_bytes(const Graph& g, const Bindings& sizes);

/// Bytes of the graph's inputs and parameters (what random_feeds allocates).
std::uint64_t feed_bytes(const Graph& g, const Bindings& sizes);

/// The peak bytes of running `g` on `backend` besides the caller's feeds: the backend's copies
/// of the feeds, the values it keeps (reference: every node's; cpu, cuda: the lowered graph's
/// buffer plan) and the outputs it returns.
std::uint64_t run_bytes(const Graph& g, const Bindings& sizes, Backend backend);

/// a * b, or UsageError naming `what` when it overflows int64.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& what);

}  // namespace qkv::cli
