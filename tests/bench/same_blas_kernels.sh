# same_blas_kernels.sh — sourced by the benchmarks that run our programs beside
# PyTorch's (mlp_vs_torch.sh, ps_vs_torch.sh, pipeline_vs_torch.sh): both sides must
# run the same OpenBLAS kernels. When OpenBLAS did not recognise the CPU and fell
# back to its generic kernels, the apps re-execute themselves with the set that
# mpr_blas_better_kernels() names (apps/common/blas.c), and PyTorch's matrix
# products go through the same OpenBLAS: export that set for both sides. An
# OPENBLAS_CORETYPE already set is left as it is (it is the user's choice).
#
# same_blas_kernels BUILD_DIR   (uses BUILD_DIR/tests/bench/bench_tensor --better-kernels)
same_blas_kernels() {
    [ -n "${OPENBLAS_CORETYPE:-}" ] && return 0
    local set
    set=$("$1/tests/bench/bench_tensor" --better-kernels 2>/dev/null) || return 0
    if [ -n "$set" ]; then
        export OPENBLAS_CORETYPE=$set
        echo "benchmark: OpenBLAS did not recognise this CPU; OPENBLAS_CORETYPE=$set for both sides" >&2
    fi
}
