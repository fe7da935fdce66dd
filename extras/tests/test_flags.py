"""A bad flag of any script under extras/ is one `error:` line and exit status 2, before any work."""

import pytest

from common.cli import run_cli
from extras.bench import bench_norms, bench_train, gpu_check
from extras.interop import compare_llama_cpp, convert_from_minimind, convert_to_gguf, convert_to_hf

BAD_FLAGS = [
    (bench_train, ["--rounds", "0"], "argument --rounds: invalid positive_int value: '0' (see --help)"),
    (bench_train, ["--modes", "jit"],
     "argument --modes: invalid choice: 'jit' (choose from 'eager', 'compiled') (see --help)"),
    (bench_train, ["--hidden_size", "72"], "--hidden_size must be a multiple of 16 (8 attention heads, each "
                                           "of an even width for rotary embeddings), got 72"),
    (bench_norms, ["--dtypes", "fp8"],
     "argument --dtypes: invalid choice: 'fp8' (choose from 'fp32', 'bf16', 'fp16') (see --help)"),
    (bench_norms, ["--threads", "-2"], "argument --threads: invalid positive_int value: '-2' (see --help)"),
    (gpu_check, ["--budget", "-5"], "argument --budget: invalid non_negative value: '-5' (see --help)"),
    (convert_from_minimind, ["m.pth", "tok", "out", "--rope_theta", "nan"],
     "argument --rope_theta: invalid non_negative value: 'nan' (see --help)"),
    (convert_from_minimind, ["m.pth", "tok", "out", "--num_attention_heads", "0"],
     "argument --num_attention_heads: invalid positive_int value: '0' (see --help)"),
    (compare_llama_cpp, ["run", "m.gguf", "--context", "1"], "--context must be at least 2, got 1"),
    (compare_llama_cpp, ["run", "m.gguf", "--windows", "0"],
     "argument --windows: invalid positive_int value: '0' (see --help)"),
    (convert_to_gguf, ["run", "m.gguf", "--outtype", "q4"],
     "argument --outtype: invalid choice: 'q4' (choose from 'bf16', 'f16', 'f32') (see --help)"),
    (convert_to_hf, ["run"], "the following arguments are required: dst_dir (see --help)"),
]


@pytest.mark.parametrize("script,argv,message", BAD_FLAGS,
                         ids=[f"{s.__name__.split('.')[-1]} {' '.join(a[-2:])}" for s, a, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_error_line(script, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a check come too late would read or write here, not in the repository
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: script.main(argv))
    assert stopped.value.code == 2 and capsys.readouterr().err.splitlines() == [f"error: {message}"]
    assert list(tmp_path.iterdir()) == []
