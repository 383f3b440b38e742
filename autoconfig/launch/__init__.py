"""Launch-ready output: one LaunchSpec (spec.py), rendered per target:
Megatron-LM arguments (megatron_lm.py), a SLURM batch script (sbatch.py),
a Megatron-Bridge / NeMo 2 recipe file (bridge.py), NeMo 1 Hydra overrides
(nemo1.py). ``write_launch_files`` writes them all."""
