// qkv/nn/axes.hpp — the axis names the building blocks in qkv::nn speak.
#pragma once

#include <qkv/qkv.hpp>

namespace qkv::nn {

QKV_AXIS(Batch);     // sequences in a batch
QKV_AXIS(Seq);       // query positions
QKV_AXIS(Key);       // key/value positions (Seq renamed for self-attention; the memory for cross-attention)
QKV_AXIS(Mem);       // positions of a cross-attention memory before it becomes `Key`
QKV_AXIS(Model);     // d_model features
QKV_AXIS(Heads);     // attention heads (query heads under GQA)
QKV_AXIS(KvHeads);   // key/value heads under GQA
QKV_AXIS(Group);     // query heads per key/value head under GQA
QKV_AXIS(HeadDim);   // per-head query/key width d_k
QKV_AXIS(ValueDim);  // per-head value width d_v
QKV_AXIS(Hidden);    // feed-forward width
QKV_AXIS(Proj);      // a projection's output before it is split (fused QKV: 3 * d_model)

}  // namespace qkv::nn
