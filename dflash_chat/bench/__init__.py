"""The measuring code: what `dflash-chat bench` runs, and the kernel checks tools/ runs without a GPU.

- comparison.py: DFlash against plain decoding with the same engine, prompt by prompt (`train` measures with it);
- pairs.py: plain `bench`, on a tiny random target (tiny_target.py) or a user's own target + drafter;
- demo_pair.py: `bench --demo`, the embedded demo pair per kind of prompt, draft setting and temperature;
- http_overhead.py: `bench --http`, the same answers in-process and through `serve`'s API;
- synthetic.py: `bench --synthetic MODEL`, the engine at a real model's shapes with random packed weights
  (synthetic_models.py builds those models); with `--image WxH`, synthetic_vision.py: the vision tower at its real
  shapes on that image beside the prefill it feeds (live_memory.py: a call's peak working memory, on any device);
- oracle.py: a drafter that knows the answer, for chosen or forced acceptance lengths;
- compile_check.py, kernel_cases.py, launch_count.py: the Triton kernels built for a GPU family, and the
  kernels each step launches, on a machine without a GPU (tools/gpu_check.py --compile-only,
  tools/kernel_count.py).

The app, `serve` and `run` import nothing from here. This face imports nothing, so the `bench` command's
module stays free of torch until it runs.
"""
