"""A model file that breaks a rule is refused before anything runs, in one line naming the rule, the value and the fix.

The family's MLP paths are split on the meta device as tp 2 splits them (``autoslapo.models.user_tp``); the
entry points' signatures, batch()'s keys and what build() and forward return are checked by the trace
(``autoslapo.models.user``); and ``verify`` takes a config's sequence past its position table as run does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoslapo.errors import UsageError
from autoslapo.models.resolve import resolve_model
from autoslapo.models.user import user_spec
from tests.modelfiles import net_source, write_model_file

EXAMPLE = Path(__file__).resolve().parents[2] / "experiments" / "my_model.py"
BARE = net_source()

MLP_IN, MLP_OUT = '    mlp_in=("mlp.fc1",),', '    mlp_out="mlp.fc2",'
SWAPPED = ('    mlp_in=("mlp.fc2",),', '    mlp_out="mlp.fc1",')


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _example(replacements: list[tuple[str, str]]) -> str:
    text = EXAMPLE.read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    return text


def _cli(cache: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    # in a process of its own: ranks forked from this one's fork server would read another test's cache
    return subprocess.run([sys.executable, "-m", "autoslapo", *argv], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "AUTOSLAPO_MODEL_CACHE": str(cache)})


def test_a_family_with_the_mlp_paths_swapped_is_refused_tp_with_the_fix(tmp_path: Path, cache: Path) -> None:
    """mlp_in and mlp_out exchanged: every size still divides tp, so estimate --tp 2 passed, a trial failed
    in the ranks ("mat1 and mat2 shapes cannot be multiplied") and verify --tp 2 was an internal error."""
    path = write_model_file(tmp_path, _example([(MLP_IN, SWAPPED[0]), (MLP_OUT, SWAPPED[1])]), "swapped.py")
    problem = user_spec(path).extra["tp_problem"]
    assert "family.mlp_in must name the Linear(s) that widen the MLP's input" in problem, problem
    assert "swapped.py's 'mlp' fails with mlp_in=('mlp.fc2',), mlp_out='mlp.fc1'" in problem, problem
    assert "set mlp_in=('mlp.fc1',), mlp_out='mlp.fc2' (with them, the split forward runs)" in problem, problem
    assert user_spec(EXAMPLE).extra["tp_problem"] == ""
    for argv in (["estimate", str(path), "--gpus", "2", "--tp", "2"], ["verify", str(path), "--tp", "2"]):
        proc = _cli(cache, *argv)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
        assert "got tp=2 for swapped.py: family.mlp_in must name" in proc.stderr and "Traceback" not in proc.stderr
    assert _cli(cache, "estimate", str(path), "--gpus", "2", "--tp", "1").returncode == 0


def test_an_mlp_split_is_tried_on_the_block_when_its_linears_are_the_blocks_own(tmp_path: Path) -> None:
    """fc1 and fc2 directly in the block (no MLP module): the block is split whole, its attention too."""
    flat = [("        self.mlp = MLP(hidden)\n",
             "        self.fc1 = nn.Linear(hidden, 4 * hidden)\n        self.fc2 = nn.Linear(4 * hidden, hidden)\n"),
            ("return x + self.mlp(self.ln2(x))", "return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))"),
            ('    mlp="mlp",\n', "    mlp=None,\n"), ('    bias_gelu="mlp",', "    bias_gelu=None,")]
    right = _example([*flat, (MLP_IN, '    mlp_in=("fc1",),'), (MLP_OUT, '    mlp_out="fc2",')])
    assert user_spec(write_model_file(tmp_path, right, "flat.py")).extra["tp_problem"] == ""
    wrong = _example([*flat, (MLP_IN, '    mlp_in=("fc2",),'), (MLP_OUT, '    mlp_out="fc1",')])
    problem = user_spec(write_model_file(tmp_path, wrong, "flat_swapped.py")).extra["tp_problem"]
    assert "flat_swapped.py's block fails with mlp_in=('fc2',), mlp_out='fc1'" in problem, problem
    assert "set mlp_in=('fc1',), mlp_out='fc2'" in problem, problem


def test_a_gate_left_out_of_mlp_in_is_named(tmp_path: Path) -> None:
    gated = [("        self.fc1 = nn.Linear(hidden, 4 * hidden)\n",
              "        self.gate = nn.Linear(hidden, 4 * hidden)\n        self.fc1 = nn.Linear(hidden, 4 * hidden)\n"),
             ("return self.fc2(self.act(self.fc1(x)))", "return self.fc2(self.act(self.gate(x)) * self.fc1(x))"),
             ('    bias_gelu="mlp",', "    bias_gelu=None,")]
    ok = _example([*gated, (MLP_IN, '    mlp_in=("mlp.gate", "mlp.fc1"),')])
    assert user_spec(write_model_file(tmp_path, ok, "gated.py")).extra["tp_problem"] == ""
    problem = user_spec(write_model_file(tmp_path, _example(gated), "no_gate.py")).extra["tp_problem"]
    assert "set mlp_in=('mlp.fc1', 'mlp.gate'), mlp_out='mlp.fc2'" in problem, problem


HEADS_ONLY = '    attention_attrs=("num_heads",),'
HEAD_DIM = "        self.head_dim = hidden // heads\n"
# local attention: a window the mask reads, named among the head counts (divided, it runs with another mask)
WINDOW = [(HEAD_DIM, HEAD_DIM + "        self.window = 8\n"),
          ('        mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)  # causal, additive\n',
           "        i = torch.arange(s, device=x.device)\n"
           "        far = (i[None, :] > i[:, None]) | (i[:, None] - i[None, :] >= self.window)\n"
           '        mask = torch.zeros(s, s, device=x.device).masked_fill(far, float("-inf"))\n'),
          (HEADS_ONLY, '    attention_attrs=("num_heads", "window"),')]
# grouped-query attention: 4 heads, 2 key/value heads of width 16
GQA = [("        self.k = nn.Linear(hidden, hidden)\n        self.v = nn.Linear(hidden, hidden)\n",
        "        self.num_kv_heads = heads // 2\n"
        "        self.k = nn.Linear(hidden, hidden // 2)\n        self.v = nn.Linear(hidden, hidden // 2)\n"),
       ("        q, k, v = (p(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, "
        "self.v))\n",
        "        q = self.q(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)\n"
        "        k, v = (p(x).view(b, s, self.num_kv_heads, -1).transpose(1, 2).repeat_interleave(\n"
        "            self.num_heads // self.num_kv_heads, 1) for p in (self.k, self.v))\n")]


def test_an_integer_named_in_attention_attrs_that_is_no_head_count_is_refused_with_the_fix(
        tmp_path: Path, cache: Path) -> None:
    """A window size listed with the head counts passed the split check (halved, the mask is another, the
    shapes the same) and `verify --tp 2` failed in the ranks: "output differs from the reference"."""
    path = write_model_file(tmp_path, _example(WINDOW), "window.py")
    with pytest.raises(UsageError) as e:
        user_spec(path)
    assert str(e.value) == (
        "family.attention_attrs names what tensor parallelism divides by tp, head counts (a count times the head "
        "width, 16, is a q/k/v projection's output width, 64) or such a width: 'window' is 8 in window.py's 'attn', "
        "expected a head count (4) or a width (64); leave 'window' out")
    proc = _cli(cache, "verify", str(path), "--tp", "2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "'window' is 8 in window.py's 'attn'" in proc.stderr and not proc.stdout
    # the number of layers (even: every size still divided tp 2), the MLP's width, a count of nothing
    for attr, value, fix in (("n_layers", 6, "leave 'n_layers' out"), ("ffn", 256, "leave 'ffn' out"),
                             ("groups", 2, "name 'num_heads' (4 in it) instead, or leave 'groups' out")):
        attrs = f'    attention_attrs=("{attr}",),' if attr == "groups" else f'    attention_attrs=("num_heads", "{attr}"),'
        text = _example([(HEAD_DIM, HEAD_DIM + f"        self.{attr} = {value}\n"), (HEADS_ONLY, attrs)])
        with pytest.raises(UsageError) as e:
            user_spec(write_model_file(tmp_path, text, f"{attr}.py"))
        assert f"{attr!r} is {value} in {attr}.py's 'attn', expected a head count (4) or a width (64); {fix}" in \
            str(e.value) and "\n" not in str(e.value), e.value
    # the heads' total width the forward reshapes by is divided rightly (BERT's all_head_size), as are key/value heads
    width = _example([(HEAD_DIM, HEAD_DIM + "        self.width = hidden\n"),
                      ("reshape(b, s, self.num_heads * self.head_dim)", "reshape(b, s, self.width)"),
                      (HEADS_ONLY, '    attention_attrs=("num_heads", "width"),')])
    assert user_spec(write_model_file(tmp_path, width, "width.py")).extra["tp_problem"] == ""
    gqa = _example([*GQA, (HEADS_ONLY, '    attention_attrs=("num_heads", "num_kv_heads"),')])
    assert user_spec(write_model_file(tmp_path, gqa, "gqa.py")).extra["tp_problem"] == ""
    gqa = _example([*GQA, (HEAD_DIM, HEAD_DIM + "        self.n_layers = 6\n"),
                    (HEADS_ONLY, '    attention_attrs=("num_heads", "num_kv_heads", "n_layers"),')])
    with pytest.raises(UsageError, match=r"'n_layers' is 6 in gqa_layers.py's 'attn', expected a head count "
                                         r"\(2, 4\) or a width \(32, 64\); leave 'n_layers' out"):
        user_spec(write_model_file(tmp_path, gqa, "gqa_layers.py"))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # batch() without its seed: a TypeError from the call, said as "must run on the meta device"
        ("def batch(micro_batch, seed):", "def batch(micro_batch):\n    seed = 0",
         "a model file must define batch(micro_batch, seed) -> dict: net.py's is batch(micro_batch), which "
         "batch(2, 0) cannot call (too many positional arguments); define it as def batch(micro_batch, seed) -> dict"),
        ("def build():", "def build(width):",
         "a model file must define build() -> nn.Module: net.py's is build(width), which build() cannot call"),
        # a key the forward does not take: said as "forward must avoid data-dependent Python control flow"
        ('{"x":', '{"inp":',
         "batch()'s keys must be the keyword arguments of the model's forward: 'inp' is not one of Net.forward in "
         "net.py (its parameters: x, y); rename the key in batch() or the forward's parameter"),
        (', "y": torch.randn(micro_batch, 1, generator=g)}', "}",
         "batch()'s keys must give every argument the model's forward requires: Net.forward in net.py requires 'y', "
         "which batch() does not give (its keys: x); add it to the dict batch() returns, or give the parameter a default"),
        # the class, not an instance: said as "got type", with no fix
        ("return Net()", "return Net",
         "build() must return an nn.Module instance: net.py's returned the class Net; return an instance (Net(...))"),
        ("return Net()", "return 3", "build() must return an nn.Module: got int from net.py; return the model"),
        # (loss, x): the loss is there; said as "compute the loss from the labels in forward"
        ("** 2).mean()", "** 2).mean(), x",
         "a model's forward must return the loss alone or an object with .loss: got a tuple of 2 whose first element "
         "is a one-number tensor, the loss; return the loss alone (a tensor of one number, shape ()), not a tuple"),
        ("** 2).mean()", "** 2).mean().reshape(1), x", "got a tuple of 2 whose first element is a one-number tensor"),
    ],
)
def test_a_broken_entry_point_is_one_line_with_rule_value_and_fix(tmp_path: Path, old: str, new: str,
                                                                  message: str) -> None:
    assert old in BARE
    path = write_model_file(tmp_path, BARE.replace(old, new), "net.py")
    with pytest.raises(UsageError) as err:
        resolve_model(str(path))
    assert message in str(err.value) and "\n" not in str(err.value), err.value
    assert "must run on the meta device" not in str(err.value) and "control flow" not in str(err.value)


def test_a_forward_taking_any_keywords_takes_any_key(tmp_path: Path) -> None:
    text = BARE.replace("def forward(self, x, y):", "def forward(self, x, **kw):\n        y = kw['y']")
    assert text != BARE and user_spec(write_model_file(tmp_path, text)).family == "user"


def test_a_bad_entry_point_is_exit_2_without_a_traceback(tmp_path: Path, cache: Path) -> None:
    path = write_model_file(tmp_path, BARE.replace("return Net()", "return Net"), "net.py")
    proc = _cli(cache, "verify", str(path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "returned the class Net; return an instance (Net(...))" in proc.stderr


def test_verify_takes_a_sequence_past_a_configs_position_table_as_run_does(tmp_path: Path, cache: Path) -> None:
    """A gpt2 config.json with n_positions 64: run --seq-len 128 grows the table and trains, verify refused
    it ("--seq-len must be <= 64 for ...: got 128", no fix)."""
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64,
                                  "vocab_size": 128, "bos_token_id": 0, "eos_token_id": 0}))
    proc = _cli(cache, "verify", str(config), "--seq-len", "128", "--batch", "2", "--tp", "2")
    assert proc.returncode == 0 and "ok - tp=2 pp=1" in proc.stdout and "batch 2x128" in proc.stdout, (
        proc.stdout + proc.stderr)
