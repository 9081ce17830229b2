"""``kernels train-dp``: the capstone GPT trained data-parallel (chapter 21; the work is in kernels_src/model/dp.py).

The parser lives here, not beside the model, so that building the command line does not import the model and,
through it, register every op: ``kernels --help`` and every other command stay as quick to start as before.
"""
from __future__ import annotations

import json


def add_parser(sub) -> None:
    from ..usage import positive_int

    s = sub.add_parser("train-dp", help="the capstone GPT trained data-parallel on N ranks (CPU processes or GPUs)")
    s.add_argument("--ranks", type=positive_int, required=True, help="number of ranks (processes)")
    s.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="cpu: CPU ranks, the course's all-reduce; gpu: one GPU per rank, NCCL")
    s.add_argument("--steps", type=positive_int, default=5)
    s.add_argument("--batch-per-rank", type=positive_int, help="sequences per rank per step (default: the config's)")
    s.add_argument("--seq", type=positive_int, help="tokens per sequence (default: the config's)")
    s.add_argument("--config", metavar="NAME",
                   help="model size, a name in kernels_src/model/dp.py's CONFIGS (default: tiny on the CPU, "
                        "bench on GPUs)")
    s.add_argument("--bucket-mb", type=float, default=0.0,
                   help="merge blocks into buckets of at least this many MiB (0: one bucket per block)")
    s.add_argument("--no-overlap", action="store_true",
                   help="start every bucket's all-reduce after backward (to measure what the overlap buys)")
    s.add_argument("--ab-overlap", type=positive_int, metavar="K",
                   help="alternate blocks of K steps with and without the overlap in the same run (a fair A/B)")
    s.add_argument("--compare", action="store_true",
                   help="also run one process on the concatenated batch (and, on the GPU, one GPU at the same "
                        "batch per GPU) and report the loss difference and the speedup")
    s.add_argument("--json", help="write the results (dp_capstone.json schema) to this file")
    s.set_defaults(func=cmd_train_dp)


def cmd_train_dp(args) -> int:
    from ..model.dp import (CONFIGS, CourseEngine, NcclEngine, make_spec, one_process, run_cpu, run_gpu,
                            summarize)
    from ..usage import UsageError, output_file

    out = output_file(args.json)
    if args.config is not None and args.config not in CONFIGS:
        raise UsageError(f"--config {args.config}: one of {', '.join(sorted(CONFIGS))}")
    if args.ranks > 64:
        raise UsageError(f"--ranks {args.ranks}: at most 64")
    if args.bucket_mb < 0:
        raise UsageError(f"--bucket-mb {args.bucket_mb}: must be >= 0")
    args.config = args.config or ("bench" if args.device == "gpu" else "tiny")
    spec = make_spec(args.config, args.ranks, args.steps, args.batch_per_rank, args.seq, bucket_mb=args.bucket_mb,
                     overlap=not args.no_overlap)
    if spec["seq"] > spec["config"]["ctx"]:
        raise UsageError(f"--seq {spec['seq']}: the {args.config} config holds at most {spec['config']['ctx']} tokens")
    spec["compare"] = args.compare
    spec["ab_block"] = args.ab_overlap or 0
    single = concat = None
    if args.device == "gpu":
        try:
            import torch
        except ImportError:
            raise UsageError("--device gpu needs torch (its NCCL); install torch or use --device cpu") from None
        have = torch.cuda.device_count()
        if args.ranks > have:
            raise UsageError(f"--ranks {args.ranks}: this machine has {have} GPU(s)")
        results = run_gpu(spec)
        r0 = results[0]
        r0["clock"] = NcclEngine.clock
        single, concat = r0.get("single_same_batch"), r0.get("single_concat")
        if args.compare and args.ranks == 1:
            single = None
        name = r0["device"]
    else:
        results = run_cpu(spec, timeout=max(120.0, 30.0 * spec["steps"]))
        results[0]["clock"] = CourseEngine.clock
        if args.compare:
            concat = one_process(spec)
        name = "cpu"
    res = summarize(spec, results, single, concat, name)
    if args.device == "gpu":
        res["meta"].update(torch=results[0]["torch"], nccl=results[0]["nccl"])
    for r in res["runs"]:
        print(f"{r['ranks']} rank(s): {r['tokens_per_s']:.0f} tokens/s, step {r['step_ms_median']:.2f} ms (median)")
    if res["speedup"]:
        print(f"speedup {res['speedup']:.2f}x at the same batch per rank")
    if "loss_max_abs_diff" in res:
        print(f"loss vs one process on the concatenated batch: max |diff| {res['loss_max_abs_diff']:.3g} "
              f"({'within' if res['loss_within_tolerance'] else 'OUTSIDE'} the tolerance)")
    print(f"replicas identical: {res['replicas_identical']}")
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if res["replicas_identical"] and res.get("loss_within_tolerance", True) else 1
