# The NVPTX backend (codegen/nvptx): kernels as LLVM IR for nvptx64-nvidia-cuda, emitted as PTX.
target_sources(qkv_codegen PRIVATE
)
