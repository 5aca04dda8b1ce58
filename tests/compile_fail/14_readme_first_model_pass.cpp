// The README's "First model" snippet (the graph it builds; running it needs the libraries): it must compile.
#include <iostream>

#include <qkv/qkv.hpp>
using namespace qkv;
QKV_AXIS(Batch); QKV_AXIS(Seq); QKV_AXIS(Key); QKV_AXIS(Model); QKV_AXIS(Heads); QKV_AXIS(HeadDim);

int main() {
Graph g;
constexpr int E = 16, H = 2;
auto x    = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>>(g, "x");   // dyn: bound at run time
auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");      // true = a real token
auto heads = [](auto t) { return permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<H>, HeadDim<E / H>>(t)); };
auto q = heads(linear(x, linear_params<Model<E>, Model<E>>(g, "q_proj")));
auto k = rename<Seq, Key>(heads(linear(x, linear_params<Model<E>, Model<E>>(g, "k_proj"))));
auto v = rename<Seq, Key>(heads(linear(x, linear_params<Model<E>, Model<E>>(g, "v_proj"))));
auto p = softmax<Key>(masked(scaled(contract<HeadDim>(q, k)), keep));   // [Batch, Heads, Seq, Key]
auto o = merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(contract<Key>(p, v)));
std::cout << g.table();   // the shape table, one line per op
(void)o;
}
