// qkv/qkv.hpp — everything a model needs: axes, tensors, ops, parameters, building blocks.
#pragma once

#include <qkv/dsl/axis.hpp>
#include <qkv/dsl/ops_decoder.hpp>
#include <qkv/dsl/ops_math.hpp>
#include <qkv/dsl/ops_pointwise.hpp>
#include <qkv/dsl/ops_structure.hpp>
#include <qkv/dsl/params.hpp>
#include <qkv/dsl/score_mod.hpp>
#include <qkv/dsl/tensor.hpp>
#include <qkv/ir/float_dtype.hpp>
#include <qkv/ir/graph.hpp>
#include <qkv/nn/attention.hpp>
#include <qkv/nn/bert.hpp>
#include <qkv/nn/gpt2.hpp>
#include <qkv/nn/llama.hpp>
#include <qkv/nn/transformer.hpp>
