"""The bad-input corpus: every CLI command fed input it must refuse with one line and exit code 2.

Each case is ``(id, argv, expected)``: ``argv`` may hold placeholders filled by ``fill``:
``{url}`` the seeded SQLite store, ``{dir}`` a scratch directory, ``{notdb}`` a text file that is no
database, ``{space}`` a search-space file written from ``SPACE_FILES``, ``{pgpw}`` a PostgreSQL
URL with a password and nobody listening. ``expected`` is a substring of the one stderr line
(case-insensitive). Commands that need no store still run with ``AUTOSLAPO_STORAGE={url}``.
"""

from __future__ import annotations

from pathlib import Path

# The password that must never be printed (redaction is checked on every case's output).
SECRET = "hunter2-s3cret"
PG_UNREACHABLE = f"postgresql://autoslapo:{SECRET}@127.0.0.1:1/autoslapo?connect_timeout=2"

# Search-space files: name -> (suffix, text).
SPACE_FILES: dict[str, tuple[str, str]] = {
    "wrong-types": (".toml", 'name = "x"\nknobs = 3\n'),
    "empty-domain": (".toml", 'name = "x"\n[knobs]\nmicro_batch = []\n'),
    "knob-value-type": (".json", '{"name": "x", "knobs": {"tp": ["two", "four"]}}'),
    "unknown-knob": (".toml", 'name = "x"\n[knobs]\nwarp_drive = [1, 2]\n'),
    "unknown-key": (".toml", 'name = "x"\nexec = "import os"\n'),
    "no-name": (".json", '{"knobs": {"tp": [1, 2]}}'),
    "not-toml": (".toml", "this is = = not toml ["),
    "not-json": (".json", "{'name': 'x',"),
    "top-list": (".json", "[1, 2, 3]"),
    "yaml": (".yaml", "name: x\n"),
    "zero-degree": (".toml", 'name = "x"\n[knobs]\ntp = [0, -2]\n'),
    "bad-ratio": (".toml", 'name = "x"\n[knobs]\nckpt_ratio = [1.5, "half"]\n'),
}

T = ["tune", "bert-tiny", "--backend", "sim", "--trials", "3", "--no-baselines"]
S = ["--storage", "{url}"]

CASES: list[tuple[str, list[str], str]] = [
    # --- tune -------------------------------------------------------------------------------
    ("tune-study-blank", [*T, "--gpus", "4", "--study", "  ", *S], "study names are 1-100 of A-Z a-z 0-9 . _ - (not dots alone, not a leading -): got '  '"),
    ("tune-study-dots", [*T, "--gpus", "4", "--study", "..", *S], "(not dots alone, not a leading -): got '..'"),
    ("tune-study-empty", [*T, "--gpus", "4", "--study", "", *S], "study names are 1-100"),
    ("tune-sim-steps", [*T, "--gpus", "4", "--steps", "3", *S], "--steps set how real trials run"),
    ("tune-max-concurrent-inline", [*T, "--gpus", "4", "--max-concurrent", "4", *S], "--max-concurrent sets how many"),
    ("tune-unknown-model", ["tune", "no-such-model", "--gpus", "4", "--backend", "sim", *S], "no-such-model"),
    ("tune-unknown-preset", ["tune", "bert-gigantic", "--gpus", "4", "--backend", "sim", *S], "bert-gigantic"),
    ("tune-gpus-zero", [*T, "--gpus", "0", *S], "gpus"),
    ("tune-gpus-negative", [*T, "--gpus", "-4", *S], "gpus"),
    ("tune-gpus-not-int", [*T, "--gpus", "four", *S], "--gpus"),
    ("tune-partial-node", [*T, "--gpus", "12", "--gpus-per-node", "8", *S], "node"),
    ("tune-gpus-per-node-zero", [*T, "--gpus", "8", "--gpus-per-node", "0", *S], "node"),
    ("tune-too-many-gpus", [*T, "--gpus", "65536", "--global-batch", "8", *S], "global batch"),
    ("tune-unknown-gpu-type", [*T, "--gpus", "4", "--gpu-type", "tpu-v9", *S], "tpu-v9"),
    ("tune-trials-zero", [*T[:-3], "--no-baselines", "--gpus", "4", "--trials", "0", *S], "trials"),
    ("tune-trials-negative", [*T[:-3], "--no-baselines", "--gpus", "4", "--trials", "-5", *S], "trials"),
    ("tune-timeout-negative", [*T, "--gpus", "4", "--timeout", "-1", *S], "timeout"),
    ("tune-patience-zero", [*T, "--gpus", "4", "--patience", "0", *S], "patience"),
    ("tune-sim-sweep-patience", [*T, "--gpus", "4", "--patience", "5", *S],
     "--patience stops a sampled search after K trials without a new best: got --patience 5"),
    ("tune-top-zero", [*T, "--gpus", "4", "--top", "0", *S], "top"),
    ("tune-max-concurrent-zero", [*T, "--gpus", "4", "--max-concurrent", "0", *S], "concurrent"),
    ("tune-seq-len-zero", [*T, "--gpus", "4", "--seq-len", "0", *S], "seq"),
    ("tune-global-batch-zero", [*T, "--gpus", "4", "--global-batch", "0", *S], "batch"),
    ("tune-steps-zero", [*T, "--gpus", "4", "--steps", "0", *S], "steps"),
    ("tune-trial-timeout-negative", [*T, "--gpus", "4", "--trial-timeout", "-3", *S], "timeout"),
    ("tune-unknown-sampler", [*T, "--gpus", "4", "--sampler", "bayes", *S], "sampler"),
    ("tune-unknown-backend", ["tune", "bert-tiny", "--gpus", "4", "--backend", "cloud", *S], "backend"),
    ("tune-storage-malformed", [*T, "--gpus", "4", "--storage", "not a url"], "storage"),
    ("tune-network-zero", [*T, "--gpus", "16", "--inter-node-gbps", "0", *S], "--inter-node-gbps is GB/s a device"),
    ("tune-nvlink-inf", [*T, "--gpus", "16", "--intra-node-gbps", "inf", *S], "at most 10,000"),
    ("tune-network-word", [*T, "--gpus", "16", "--inter-node-gbps", "fast", *S], "--inter-node-gbps"),
    ("tune-storage-scheme", [*T, "--gpus", "4", "--storage", "mysql://u@localhost/db"], "sqlite or postgresql"),
    ("tune-storage-pg-no-db", [*T, "--gpus", "4", "--storage", "postgresql://u@127.0.0.1:1"], "database"),
    ("tune-storage-unreachable", [*T, "--gpus", "4", "--storage", "{pgpw}"], "postgresql"),
    ("tune-storage-not-db", [*T, "--gpus", "4", "--storage", "sqlite:///{notdb}"], "not"),
    ("tune-storage-no-dir", [*T, "--gpus", "4", "--storage", "sqlite:///{dir}/missing/x.db"], "directory"),
    ("tune-storage-is-dir", [*T, "--gpus", "4", "--storage", "sqlite:///{dir}"], "file"),
    ("tune-space-wrong-types", [*T, "--gpus", "4", "--space", "{space:wrong-types}", *S], "knobs"),
    ("tune-space-empty-domain", [*T, "--gpus", "4", "--space", "{space:empty-domain}", *S], "micro_batch"),
    ("tune-space-value-type", [*T, "--gpus", "4", "--space", "{space:knob-value-type}", *S], "tp"),
    ("tune-space-unknown-knob", [*T, "--gpus", "4", "--space", "{space:unknown-knob}", *S], "warp_drive"),
    ("tune-space-unknown-key", [*T, "--gpus", "4", "--space", "{space:unknown-key}", *S], "exec"),
    ("tune-space-no-name", [*T, "--gpus", "4", "--space", "{space:no-name}", *S], "name"),
    ("tune-space-not-toml", [*T, "--gpus", "4", "--space", "{space:not-toml}", *S], "toml"),
    ("tune-space-not-json", [*T, "--gpus", "4", "--space", "{space:not-json}", *S], "json"),
    ("tune-space-top-list", [*T, "--gpus", "4", "--space", "{space:top-list}", *S], "table"),
    ("tune-space-yaml", [*T, "--gpus", "4", "--space", "{space:yaml}", *S], ".toml or .json"),
    ("tune-space-zero-degree", [*T, "--gpus", "4", "--space", "{space:zero-degree}", *S], "tp"),
    ("tune-space-bad-ratio", [*T, "--gpus", "4", "--space", "{space:bad-ratio}", *S], "ckpt_ratio"),
    ("tune-space-missing", [*T, "--gpus", "4", "--space", "{dir}/nope.toml", *S], "readable"),
    ("tune-ray-address-inline", [*T, "--gpus", "4", "--ray-address", "127.0.0.1:1", "--dispatch", "inline", *S],
     "ray"),
    ("tune-ray-address-no-token", [*T, "--gpus", "4", "--ray-address", "127.0.0.1:1", *S], "RAY_AUTH_MODE"),
    ("tune-join-and-resume", [*T, "--gpus", "4", "--study", "seeded", "--join", "--resume", *S], "--join"),
    ("tune-join-without-study", [*T, "--gpus", "4", "--join", *S], "--study"),
    ("tune-local-gpu-type-no-cuda", [*T[:3], "local", "--gpus", "2", "--gpu-type", "a100-80gb", "--trials", "1",
                                     *S], "cuda"),
    ("tune-study-exists", [*T, "--gpus", "4", "--study", "seeded", *S], "seeded"),
    ("tune-study-other-model", ["tune", "gpt2-tiny", "--gpus", "4", "--backend", "sim", "--study", "seeded", *S],
     "different model"),
    ("tune-join-other-model", ["tune", "gpt2-tiny", "--gpus", "4", "--backend", "sim", "--study", "seeded",
                               "--join", *S], "different model"),
    ("tune-resume-other-model", ["tune", "gpt2-tiny", "--gpus", "4", "--backend", "sim", "--study", "seeded",
                                 "--resume", *S], "seeded"),
    ("tune-resume-other-cluster", [*T, "--gpus", "8", "--study", "seeded", "--resume", *S], "seeded"),
    ("tune-resume-missing", [*T, "--gpus", "4", "--study", "never-was", "--resume", *S], "never-was"),
    ("tune-unknown-flag", [*T, "--gpus", "4", "--turbo", *S], "--turbo"),
    ("tune-gpus-absurd", [*T, "--gpus", "1000000000000", *S], "--gpus must be at most 1,048,576"),
    ("tune-gpus-per-node-absurd", [*T, "--gpus", "4096", "--gpus-per-node", "4096", *S], "--gpus-per-node must be"),
    ("tune-hidden-absurd", [*T, "--gpus", "4", "--hidden", "1000000000", *S], "hidden must be at most"),
    ("tune-layers-absurd", [*T, "--gpus", "4", "--layers", "100000000", *S], "layers must be at most"),
    ("tune-kv-heads-no-gqa", [*T, "--gpus", "4", "--kv-heads", "2", *S], "kv_heads must equal heads"),
    # a pinned degree that can never run: its own rule, not an empty study nor a batch no layout fills
    ("tune-tp-not-dividing-heads", [*T, "--gpus", "6", "--gpus-per-node", "6", "--tp", "3", *S],
     "tp must divide the attention heads"),
    ("tune-tp-not-dividing-gpus", [*T, "--gpus", "6", "--gpus-per-node", "6", "--tp", "4", *S], "tp must divide --gpus"),
    ("tune-tp-across-nodes", [*T, "--gpus", "8", "--gpus-per-node", "2", "--tp", "4", *S], "tp must stay within a node"),
    ("tune-pp-not-dividing-gpus", [*T, "--gpus", "4", "--pp", "3", *S], "pp must divide --gpus"),
    ("tune-resume-baselines", [*T, "--gpus", "4", "--study", "seeded.baselines", "--resume", *S],
     "names ending in '.baselines' are the tuner's own"),
    ("tune-seed-negative", [*T, "--gpus", "4", "--seed", "-1", *S], "--seed must be a whole number from 0 to 2**32 - 1"),
    ("tune-seed-huge", [*T, "--gpus", "4", "--seed", "4294967296", *S], "got 4294967296"),
    ("tune-micro-batch-splits-no-batch", [*T, "--gpus", "2", "--global-batch", "16", "--micro-batch", "3", *S],
     "pin a --micro-batch that divides 16 / dp"),
    ("tune-sim-repeats", [*T, "--gpus", "4", "--repeats", "3", *S], "--repeats re-measures real trials"),
    ("tune-new-baselines-name", [*T, "--gpus", "4", "--study", "mine.baselines", *S], "'.baselines'"),
    # --- best -------------------------------------------------------------------------------
    ("best-unknown-model", ["best", "no-such-model", "--gpus", "4", *S], "no-such-model"),
    ("best-gpus-zero", ["best", "bert-tiny", "--gpus", "0", *S], "gpus"),
    ("best-gpus-negative", ["best", "bert-tiny", "--gpus", "-8", *S], "gpus"),
    ("best-global-batch-zero", ["best", "bert-tiny", "--gpus", "4", "--global-batch", "0", *S],
     "--global-batch must be a positive integer: got 0"),
    ("best-global-batch-huge", ["best", "bert-tiny", "--gpus", "4", "--global-batch", "16777217", *S],
     "--global-batch must be at most 16,777,216"),
    ("best-unknown-gpu-type", ["best", "bert-tiny", "--gpus", "4", "--gpu-type", "tpu-v9", *S], "tpu-v9"),
    ("best-bad-metric", ["best", "bert-tiny", "--gpus", "4", "--metric", "vibes", *S], "metric"),
    ("best-gpus-per-node-zero", ["best", "bert-tiny", "--gpus", "4", "--gpus-per-node", "0", *S], "--gpus-per-node"),
    ("estimate-global-batch-zero", ["estimate", "bert-tiny", "--gpus", "4", "--global-batch", "0"],
     "--global-batch must be a positive integer"),
    ("estimate-global-batch-huge", ["estimate", "bert-tiny", "--gpus", "4", "--global-batch", "99999999999999999999"],
     "--global-batch must be at most 16,777,216"),
    ("tune-global-batch-huge", [*T, "--gpus", "4", "--global-batch", "16777217", *S], "at most 16,777,216"),
    ("estimate-interleaved-one-stage", ["estimate", "bert-tiny", "--gpus", "4", "--pp", "1", "--pipeline-schedule",
                                        "interleaved"], "interleaved pipeline schedule needs pp > 1"),
    ("estimate-gpus-per-node-zero", ["estimate", "bert-tiny", "--gpus", "4", "--gpus-per-node", "0"],
     "--gpus-per-node must be a positive integer: got 0"),
    ("estimate-unknown-flag", ["estimate", "bert-tiny", "--gpus", "4", "--turbo"], "see autoslapo estimate --help"),
    ("estimate-model-directory", ["estimate", "{dir}", "--gpus", "4"], "is a directory; give a preset's name"),
    ("estimate-hub-id", ["estimate", "mistralai/Mistral-7B-v0.1", "--gpus", "4"], "looks like a Hugging Face Hub id"),
    ("best-bad-headroom", ["best", "bert-tiny", "--gpus", "4", "--headroom", "lots", *S], "headroom"),
    ("best-not-db", ["best", "bert-tiny", "--gpus", "4", "--storage", "sqlite:///{notdb}"], "not"),
    ("best-unreachable", ["best", "bert-tiny", "--gpus", "4", "--storage", "{pgpw}"], "postgresql"),
    ("best-gpus-absurd", ["best", "bert-tiny", "--gpus", "1000000000000", *S], "at most 1,048,576"),
    ("best-layers-zero", ["best", "bert-tiny", "--gpus", "4", "--layers", "0", *S], "layers"),
    # --- run --------------------------------------------------------------------------------
    ("run-unknown-model", ["run", "no-such-model", "--gpus", "1"], "no-such-model"),
    ("run-gpus-zero", ["run", "bert-tiny", "--gpus", "0"], "gpus"),
    ("run-gpus-negative", ["run", "bert-tiny", "--gpus", "-2"], "gpus"),
    ("run-tp-not-dividing", ["run", "bert-tiny", "--gpus", "4", "--tp", "3"], "tp"),
    ("run-ckpt-ratio", ["run", "bert-tiny", "--gpus", "1", "--ckpt-ratio", "1.5"], "ckpt"),
    ("run-granularity-no-ratio", ["run", "bert-tiny", "--gpus", "1", "--ckpt-granularity", "selective"],
     "--ckpt-granularity selective acts on checkpointed layers: got it with --ckpt-ratio 0"),
    ("run-too-large-for-this-machine", ["run", "bert-tiny", "--gpus", "1", "--seq-len", "1000000", "--micro-batch", "64"],
     "the ranks must fit in this machine's available memory"),
    ("verify-too-large-for-this-machine", ["verify", "bert-tiny", "--seq-len", "1000000", "--batch", "64"],
     "the ranks must fit in this machine's available memory"),
    ("verify-granularity-no-ratio", ["verify", "bert-tiny", "--ckpt-granularity", "selective"],
     "--ckpt-granularity selective acts on checkpointed layers"),
    ("run-placement-no-ratio", ["run", "bert-tiny", "--gpus", "1", "--ckpt-placement", "back"],
     "--ckpt-placement back acts on checkpointed layers"),
    ("run-mem-cap-tiny", ["run", "bert-tiny", "--gpus", "1", "--device", "cpu", "--mem-cap", "1KiB"],
     "--mem-cap must be at least 400 MiB"),
    ("run-seed-negative", ["run", "bert-tiny", "--gpus", "1", "--seed", "-1"],
     "--seed must be a whole number from 0 to 2**32 - 1"),
    ("run-steps-zero", ["run", "bert-tiny", "--gpus", "1", "--steps", "0"], "steps"),
    ("run-timeout-negative", ["run", "bert-tiny", "--gpus", "1", "--timeout", "-1"], "timeout"),
    ("run-mem-cap", ["run", "bert-tiny", "--gpus", "1", "--mem-cap", "lots"], "mem-cap"),
    ("run-zero-stage", ["run", "bert-tiny", "--gpus", "1", "--zero-stage", "4"], "zero-stage"),
    ("run-sp-without-tp", ["run", "bert-tiny", "--gpus", "1", "--sequence-parallel"], "sequence"),
    ("run-hidden-absurd", ["run", "bert-tiny", "--gpus", "1", "--hidden", "999999999"], "hidden must be at most"),
    # --- estimate ---------------------------------------------------------------------------
    ("estimate-unknown-model", ["estimate", "no-such-model", "--gpus", "8"], "no-such-model"),
    ("estimate-gpus-zero", ["estimate", "bert", "--gpus", "0"], "gpus"),
    ("estimate-gpus-negative", ["estimate", "bert", "--gpus", "-8"], "gpus"),
    ("estimate-gpu-type", ["estimate", "bert", "--gpus", "8", "--gpu-type", "tpu-v9"], "tpu-v9"),
    ("estimate-partial-node", ["estimate", "bert", "--gpus", "12", "--gpus-per-node", "8"], "node"),
    ("estimate-network-negative", ["estimate", "bert", "--gpus", "16", "--inter-node-gbps", "-25"], "above 0"),
    ("estimate-nvlink-nan", ["estimate", "bert", "--gpus", "16", "--intra-node-gbps", "nan"], "got nan"),
    ("best-network-zero", ["best", "bert", "--gpus", "16", "--inter-node-gbps", "0", *S], "--inter-node-gbps is GB/s"),
    ("estimate-tp-not-dividing", ["estimate", "bert", "--gpus", "8", "--tp", "3"], "tp"),
    ("estimate-degrees-product", ["estimate", "bert", "--gpus", "8", "--tp", "2", "--pp", "2", "--dp", "4"], "8"),
    ("estimate-profile-missing", ["estimate", "bert", "--gpus", "8", "--profile", "{dir}/nope.json"], "profile"),
    ("estimate-profile-not-json", ["estimate", "bert", "--gpus", "8", "--profile", "{notdb}"], "profile"),
    ("estimate-negative-layers", ["estimate", "bert", "--gpus", "8", "--layers", "-1"], "layers"),
    ("estimate-gpus-absurd", ["estimate", "bert", "--gpus", "1000000000000"], "--gpus must be at most"),
    ("estimate-vocab-absurd", ["estimate", "bert", "--gpus", "8", "--vocab", "10000000000"], "vocab must be at most"),
    ("estimate-seq-len-absurd", ["estimate", "bert", "--gpus", "8", "--seq-len", "100000000"], "seq_len must be"),
    ("estimate-heads-absurd", ["estimate", "bert", "--gpus", "8", "--heads", "100000"], "heads must be at most"),
    ("estimate-kv-heads-not-dividing", ["estimate", "llama-7b", "--gpus", "8", "--kv-heads", "5"],
     "kv_heads must divide heads"),
    ("estimate-kv-heads-no-gqa", ["estimate", "gpt2", "--gpus", "8", "--kv-heads", "4"], "kv_heads must equal"),
    # --- verify -----------------------------------------------------------------------------
    ("verify-unknown-model", ["verify", "no-such-model"], "no-such-model"),
    ("verify-tp-zero", ["verify", "bert-tiny", "--tp", "0"], "tp"),
    ("verify-ckpt-ratio", ["verify", "bert-tiny", "--ckpt-ratio", "-0.5"], "ckpt"),
    ("verify-batch-zero", ["verify", "bert-tiny", "--batch", "0"], "batch"),
    ("verify-device", ["verify", "bert-tiny", "--device", "tpu"], "device"),
    ("verify-timeout-zero", ["verify", "bert-tiny", "--timeout", "0"], "--timeout must be positive seconds: got 0.0"),
    ("verify-kv-heads-no-gqa", ["verify", "bert-tiny", "--kv-heads", "2"], "kv_heads"),
    # --- models -----------------------------------------------------------------------------
    ("models-unknown-flag", ["models", "--wide"], "--wide"),
    # --- studies / show / export / report ---------------------------------------------------
    ("studies-not-db", ["studies", "--storage", "sqlite:///{notdb}"], "not"),
    ("studies-malformed-url", ["studies", "--storage", "://nothing"], "storage"),
    ("studies-unreachable", ["studies", "--storage", "{pgpw}"], "postgresql"),
    ("studies-env-not-db", ["studies", "--storage", "sqlite:///{dir}"], "file"),
    ("show-missing-study", ["show", "never-was", *S], "never-was"),
    ("show-limit-negative", ["show", "seeded", "--limit", "-1", *S], "limit"),
    ("show-asc-desc", ["show", "seeded", "--asc", "--desc", *S], "--desc"),
    ("show-bad-sort", ["show", "seeded", "--sort", "vibes", *S], "sort"),
    ("show-bad-status", ["show", "seeded", "--status", "happy", *S], "status"),
    ("export-missing-study", ["export", "never-was", "-o", "{dir}/out.csv", *S], "never-was"),
    ("export-bad-suffix", ["export", "seeded", "-o", "{dir}/out.xlsx", *S], "xlsx"),
    ("export-missing-dir", ["export", "seeded", "-o", "{dir}/missing/out.csv", *S], "missing"),
    ("report-missing-study", ["report", "never-was", "-o", "{dir}/rep", *S], "never-was"),
    ("best-no-store", ["best", "bert-tiny", "--gpus", "4", "--storage", "sqlite:///{dir}/none.db"], "no store at"),
    ("report-output-is-file", ["report", "seeded", "-o", "{notdb}", *S], "directory"),
    ("export-dir-is-file", ["export", "seeded", "-o", "{notdb}/out.csv", *S], "is not a directory"),
    ("export-unwritable", ["export", "seeded", "-o", "/proc/out.csv", *S], "must be writable"),
    ("report-unwritable", ["report", "seeded", "-o", "/proc", *S], "must be writable"),
    # --- the service ------------------------------------------------------------------------
    ("serve-bad-port", ["serve", "--port", "70000", *S], "--port must be 0-65535 (0 picks a free one): got 70000"),
    ("serve-bad-workers", ["serve", "--workers", "-1", *S], "--workers must be 0 or more: got -1"),
    ("serve-bad-max-body", ["serve", "--max-body", "0", *S], "--max-body must be at least 1 byte: got 0"),
    ("worker-bad-lease", ["worker", "--lease", "0", *S], "lease"),
    ("token-create-no-name", ["token", "create", *S], "--name"),
    ("token-create-bad-name", ["token", "create", "--name", "a b", *S], "token names"),
    ("token-revoke-unknown", ["token", "revoke", "--name", "nobody", *S], "nobody"),
    # taken and ignored, they read as filters
    ("token-list-role", ["token", "list", "--role", "admin", *S], "`autoslapo token list` takes no --role"),
    ("tune-server-bad-url", [*T, "--gpus", "4", "--server", "ftp://x"], "http"),
    ("best-server-down", ["best", "bert-tiny", "--gpus", "4", "--server", "http://127.0.0.1:9"], "cannot reach"),
    # --- profile and the top level ----------------------------------------------------------
    ("profile-ranks-zero", ["profile", "--ranks", "0"], "ranks"),
    ("profile-threads-negative", ["profile", "--threads", "-1"], "threads"),
    ("profile-ranks-too-many", ["profile", "--ranks", "65"], "ranks"),
    ("unknown-command", ["frobnicate"], "frobnicate"),
    ("misspelled-command", ["tnue", "bert-tiny", "--gpus", "4"], "no command 'tnue'; did you mean tune?"),
    # a long flag is spelled out: "--trial 3" meant --trials (argparse took it), and a misspelled one is named
    ("tune-abbreviated-flag", [*T[:-3], "--no-baselines", "--gpus", "4", "--trial", "3", *S],
     "--trial: did you mean --trial-timeout or --trials?"),
    ("tune-flag-hides-required", ["tune", "bert-tiny", "--gpu", "4", "--backend", "sim", *S],
     "--gpu: did you mean --gpu-type or --gpus or --gpus-per-node?"),
    # one dash, or capitals: argparse said "--gpus is required" (or "unrecognized arguments: --TRIALS")
    ("tune-single-dash-flag", ["tune", "bert-tiny", "-gpus", "4", "--backend", "sim", *S], "-gpus: did you mean --gpus?"),
    ("tune-capital-flag", [*T[:-3], "--no-baselines", "--gpus", "4", "--TRIALS", "3", *S], "--TRIALS: did you mean --trials?"),
    # a flag before the command: its value ("{url}") was read as the command
    ("flag-before-command", [*S, "studies"], "flags go after the command: got --storage"),
    # ... and the command it suggested kept the flag misspelt ("write autoslapo tune -gpus 4 ...")
    ("misspelt-flag-before-command", ["-gpus", "4", "tune", "bert-tiny", "--backend", "sim", *S],
     "got -gpus 4 before it; write autoslapo tune --gpus 4 ..."),
    ("tune-timeout-nan", [*T, "--gpus", "4", "--timeout", "nan", *S], "--timeout must be positive, finite seconds: got nan"),
    ("tune-server-steps", ["tune", "bert-tiny", "--gpus", "4", "--trials", "3", "--steps", "3", "--server",
                           "http://127.0.0.1:9"], "--server submits a plain study: --steps cannot be sent; drop it"),
    # the Ray tune starts here has no GPU: the study ended "complete" with every trial pruned ("0 GPU(s) here")
    ("tune-ray-no-gpus", ["tune", "bert-tiny", "--gpus", "2", "--gpu-type", "a100-80gb", "--backend", "ray",
                          "--trials", "3", "--no-baselines", *S], "needs 2, it has 0; join a GPU cluster"),
    ("tune-server-timeout-inf", ["tune", "bert-tiny", "--gpus", "4", "--timeout", "inf", "--server", "http://127.0.0.1:9"],
     "--timeout must be positive, finite seconds: got inf"),  # it failed sending: "not JSON compliant"
    ("best-headroom-inf", ["best", "bert-tiny", "--gpus", "4", "--headroom", "inf", *S], "--headroom must be GiB"),
    ("tune-study-dash", [*T, "--gpus", "4", "--study=-x", *S], "not a leading -): got '-x'"),
    ("token-revoke-no-store", ["token", "revoke", "--name", "x", "--storage", "sqlite:///{dir}/none.db"],
     "no store at"),
    ("serve-foreign-address", ["serve", "--host", "10.255.255.1", "--port", "18396", *S],
     "--host must name an address of this machine"),
    ("worker-lease-nan", ["worker", "--once", "--lease", "nan", *S], "--lease and --poll must be positive seconds"),
    ("serve-unknown-host", ["serve", "--host", "no-such-host.invalid", "--port", "18397", *S],
     "--host must name an address of this machine"),
    ("estimate-misspelled-flag", ["estimate", "bert-tiny", "--gpus", "4", "--micro-bach=2"],
     "--micro-bach: did you mean --micro-batch?"),
]


def fill(argv: list[str], *, url: str, dir: Path, notdb: Path, spaces: dict[str, Path]) -> list[str]:
    """``argv`` with its placeholders replaced (see the module docstring)."""
    out = []
    for a in argv:
        for name, path in spaces.items():
            a = a.replace("{space:" + name + "}", str(path))
        out.append(a.replace("{url}", url).replace("{dir}", str(dir)).replace("{notdb}", str(notdb))
                   .replace("{pgpw}", PG_UNREACHABLE))
    return out


def write_space_files(dir: Path) -> dict[str, Path]:
    """Write every ``SPACE_FILES`` entry under ``dir``; returns name -> path."""
    paths = {}
    for name, (suffix, text) in SPACE_FILES.items():
        p = dir / f"space-{name}{suffix}"
        p.write_text(text)
        paths[name] = p
    return paths
