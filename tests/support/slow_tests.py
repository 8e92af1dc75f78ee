"""What the quick loop (``python -m pytest -q -m \"not slow\"``) leaves out besides the tests marked
``slow`` one by one; tests/conftest.py marks them."""

# The quick loop (``-m "not slow"``) leaves out what trains, runs a command end to end, starts
# processes or compilers, or draws hundreds of examples: these files whole (file: why), besides the
# tests marked ``slow`` one by one. Every op's gradient property test stays in the quick loop.
SLOW_FILES = {
    "app/test_benchmarks_smoke.py": "runs the benchmarks",
    "app/test_capsule_research_cli.py": "trains and runs the study scripts",
    "app/test_cli.py": "trains", "app/test_crash_consistency.py": "trains in processes it kills",
    "app/test_fuzz_cli.py": "a fuzz suite of commands", "app/test_fuzz_outputs.py": "a fuzz suite of commands",
    "app/test_gpu_check_script.py": "runs gpu_check.sh", "app/test_newcomer_cli.py": "trains",
    "app/test_recipe_cli.py": "trains every routing with --recipe authors",
    "app/test_reliability.py": "runs commands end to end", "app/test_resume_options.py": "trains and resumes",
    "app/test_routing_cli.py": "trains every routing", "app/test_study.py": "runs studies",
    "app/test_tensorboard.py": "trains and exports", "app/test_train_cuda_graph_options.py": "trains on the stand-in",
    "app/test_visualize.py": "trains, then draws",
    "data/test_fuzz_data.py": "a fuzz suite that trains on what it reads",
    "distributed/test_distributed.py": "mpirun", "distributed/test_distributed_standin.py": "mpirun on the stand-in",
    "engine/test_torch_oracle.py": "PyTorch's answers for every op (the gradient properties run quick)",
    "kernels/test_cuda_graphs.py": "captured training on the stand-in",
    "kernels/test_cupy_standin.py": "the GPU tests in processes on the stand-in",
    "kernels/test_kernels_compile.py": "NVRTC compiles every kernel",
    "kernels/test_kernels_emulation.py": "g++ builds the emulation, sanitizers",
    "kernels/test_kernels_warps.py": "g++ builds the emulation, sanitizers",
    "models/test_gradflow.py": "trains and draws",
}
SLOW_TESTS = {  # single tests of files otherwise quick
    "app/test_readme.py::test_document_example_runs": "the documents' examples train and draw",
    "engine/test_tape.py::test_a_chain_of_20000_ops_needs_no_recursion": "20,000 ops",
    "models/test_baseline_cnn.py::test_baseline_learns_a_separable_pattern": "trains",
}
