// qkv/codegen/lowering/storage.hpp — how every backend stores a value of each dtype: the one
// place that says so (no LLVM).
//
// Today: bool is one byte per element (0 / 1), every other dtype is computed and stored as f32
// (inputs of other dtypes are converted on the way in; the reference interpreter does the same).
// bf16 / f16 storage will change this table, and only this table, first.
#pragma once

#include <cstddef>

#include <qkv/ir/dtype.hpp>

namespace qkv::codegen {

/// The dtype a value of dtype `t` is stored as by the compiled backends.
inline DType storage_dtype(DType t) { return t == DType::boolean ? DType::boolean : DType::f32; }

/// Bytes per element as stored.
inline std::size_t storage_bytes(DType t) { return dtype_size(storage_dtype(t)); }

}  // namespace qkv::codegen
