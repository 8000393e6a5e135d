# Sourced by the GPU scripts (gpu_check.sh, gpu_train.sh), from the repository root, with $python
# and $stage set: keeps this call's part of the stage (benchmarks/gpu_stage.py), and once all
# parts have come, installs the pinned wheels under $stage/site and puts them on PYTHONPATH.
# Returns 0 (ready), 3 (parts still to come: the message names the next) or 1 (failed).
stage_ready() {
  "$python" benchmarks/gpu_stage.py receive .gpu-stage "$stage" || return $?
  if [[ ! -d "$stage/site" ]]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$stage/site" "$stage"/files/wheels/*.whl || return 1
  fi
  export PYTHONPATH="$stage/site:$PWD"
}
