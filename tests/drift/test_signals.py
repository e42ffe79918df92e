"""The field's weight-statistic selectors: WeightWatcher's alpha and PEFT's kappa equal the packages' own values,
Spectrum's SNR follows spectrum.py step by step, and each ranks a card at the same budget as a topology card."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
import torch

from topotuner_lab.cli import main
from topotuner_lab.drift.cache import DriftCache
from topotuner_lab.drift.compute import drift_table
from topotuner_lab.drift.settings import DriftSettings
from topotuner_lab.drift.signals import SIGNALS, signal_table, with_signals
from topotuner_lab.drift.tables import save_table
from topotuner_lab.profiles.card import ModelIdentity, ProfileCard
from topotuner_lab.profiles.select import CardSettings, build_profile
from topotuner_lab.topology.spectral import condition_number, powerlaw_alpha, powerlaw_fit, spectrum_snr
from topotuner_lab.weights.extract import extract_snapshot
from topotuner_lab.weights.projections import enumerate_projections
from topotuner_lab.weights.snapshot import perturb_snapshot, save_snapshot


def _heavy_tailed(rows: int, cols: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.distributions.StudentT(3.0).sample((rows, cols)) * 0.02


@pytest.mark.parametrize("shape", [(192, 576), (576, 192), (256, 256)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_alpha_equals_weightwatchers(shape):
    import weightwatcher  # a dev dependency: the reference this test checks against

    logging.disable(logging.WARNING)
    layer = torch.nn.Linear(shape[1], shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(_heavy_tailed(*shape, seed=sum(shape)))
    details = weightwatcher.WeightWatcher(model=torch.nn.Sequential(layer)).analyze(plot=False)
    logging.disable(logging.NOTSET)
    fit = powerlaw_fit(np.linalg.svd(layer.weight.detach().double().numpy(), compute_uv=False) ** 2)
    assert fit.alpha == pytest.approx(float(details["alpha"].iloc[0]), rel=1e-6)
    assert fit.xmin == pytest.approx(float(details["xmin"].iloc[0]), rel=1e-6)


def test_kappa_equals_peft_kappatune(tiny_llama):
    from peft.helpers import KappaTuneSelector

    selector = KappaTuneSelector(tiny_llama.model, show_progress=False)
    selector._compute_kappas()
    theirs = selector._condition_numbers
    for projection in enumerate_projections(tiny_llama.model):
        module = projection.param_name.removesuffix(".weight")
        ours = condition_number(projection.matrix(tiny_llama.model).detach().numpy())
        assert ours == pytest.approx(theirs[module], rel=1e-3), module  # PEFT's float32 SVD vs our float64


def _spectrum_py_snr(weights: torch.Tensor) -> float:
    """The steps of cognitivecomputations/spectrum's ``calculate_snr_for_layer``, in torch."""
    s = torch.linalg.svdvals(weights.double())
    sigma = (torch.quantile(s, 0.75) - torch.quantile(s, 0.25)) / 1.349
    n, m = weights.shape[-2:]
    beta = n / m if n < m else m / n
    signal_mask = s > sigma * np.sqrt((1 + np.sqrt(beta)) ** 2)
    signal = s[signal_mask].sum() if signal_mask.any() else torch.tensor(0.0)
    noise = s[~signal_mask].sum() if (~signal_mask).any() else torch.tensor(1.0)
    return float(signal / noise / s[0])


@pytest.mark.parametrize("rank", [0, 4, 16])
def test_spectrum_snr_follows_spectrum_py(rank):
    rng = np.random.default_rng(rank)
    noise = rng.normal(0, 1, (192, 576))
    low_rank = rng.normal(0, 1, (192, rank)) @ rng.normal(0, 1, (rank, 576)) if rank else 0.0
    matrix = noise + 3 * low_rank
    assert spectrum_snr(matrix) == pytest.approx(_spectrum_py_snr(torch.tensor(matrix)), rel=1e-9)


def test_powerlaw_fit_recovers_a_known_exponent():
    rng = np.random.default_rng(0)
    samples = (1 - rng.random(4000)) ** (-1 / 2.5)  # Pareto with density exponent 3.5, xmin 1
    fit = powerlaw_fit(samples)
    assert fit.alpha == pytest.approx(3.5, abs=0.15) and fit.xmin >= 1.0
    assert np.isnan(powerlaw_alpha(np.zeros((3, 3))))  # no positive eigenvalue: no fit


@pytest.fixture
def pretrained_and_table(tiny_llama):
    pre = extract_snapshot(tiny_llama)
    table = drift_table(pre, perturb_snapshot(pre, 0.05), DriftSettings(maxdim=0), n_jobs=1, cache=DriftCache(None))
    return pre, table


@pytest.mark.parametrize(
    "strategy, column, descending",
    [("snr", "spectrum_snr", True), ("alpha", "ww_alpha", True), ("kappa", "kappa", False)],
)
def test_each_selector_ranks_a_card_by_its_column(pretrained_and_table, strategy, column, descending):
    pre, table = pretrained_and_table
    joined = with_signals(table, pre)
    assert set(SIGNALS) <= set(joined.columns) and joined.attrs == table.attrs
    card = build_profile(
        joined, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", strategy=strategy, count=3)
    )
    expected = signal_table(pre).sort_values(column, ascending=not descending, kind="stable")["pid"].tolist()
    assert [r["pid"] for r in card.ranking] == expected and card.metric == column and card.normalization == "raw"
    assert set(card.trainable) == set(expected[:3])


def test_a_selector_card_from_the_command_line(tmp_path, pretrained_and_table, capsys):
    pre, table = pretrained_and_table
    save_table(table, tmp_path / "t.parquet")
    save_snapshot(pre, tmp_path / "pre.safetensors")
    argv = ["profile", str(tmp_path / "t.parquet"), "--pretrained", str(tmp_path / "pre.safetensors")]
    assert (
        main([*argv, "--prior-task", "sst2", "--strategy", "kappa", "--count", "2", "-o", str(tmp_path / "k.json")])
        == 0
    )
    assert ProfileCard.load(tmp_path / "k.json").metric == "kappa"


def test_a_selector_without_its_column_says_how_to_add_it(pretrained_and_table):
    from topotuner_lab._io.errors import ProfileError

    pre, table = pretrained_and_table
    with pytest.raises(ProfileError, match="with_signals"):
        build_profile(table, ModelIdentity.from_snapshot(pre), CardSettings(prior_task="sst2", strategy="snr", count=2))


def test_a_signal_joins_by_projection_id_keeping_the_tables_attrs(pretrained_and_table):
    from topotuner_lab._io.errors import ProfileError
    from topotuner_lab.drift.signals import join_signal

    _, table = pretrained_and_table
    values = pd.DataFrame({"pid": table["pid"][::-1], "grad_norm": np.arange(len(table), dtype=float)})
    joined = join_signal(table, values)
    assert joined.attrs == table.attrs and list(joined["pid"]) == list(table["pid"])
    assert dict(zip(joined["pid"], joined["grad_norm"])) == dict(zip(values["pid"], values["grad_norm"]))
    replaced = join_signal(joined, values.assign(grad_norm=1.0))
    assert (replaced["grad_norm"] == 1.0).all() and list(replaced.columns) == list(joined.columns)
    with pytest.raises(ProfileError, match="lack projection ids"):
        join_signal(table, values.iloc[1:])
