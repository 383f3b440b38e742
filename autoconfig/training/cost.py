"""What a capacity cell costs: money, energy and carbon of training the budget.

Pure functions of the cell's days and cluster size and a few sourced
assumptions (``heuristics/energy.yaml``), every one overridable:

- GPU-hours = days x 24 x GPUs; cost = GPU-hours x price (USD per GPU-hour,
  given by the user; there are no built-in prices).
- power per GPU = TDP (``configs/gpus/*.yaml`` ``tdp_w``) x ``gpu_power_fraction``
  (default 1.0: Meta's model-card method, TDP x GPU-hours, an upper bound).
- node overhead per node = ``node_power_w - gpus_per_node x tdp_w`` (CPUs,
  memory, NICs, fans at the system datasheet's maximum), or the user's value.
- IT energy (kWh) = (GPUs x GPU power + nodes x node overhead) x hours / 1000;
  facility energy = IT energy x PUE; CO2 (tonnes) = facility kWh x grid
  kg CO2/kWh / 1000.

What it leaves out: storage, the scale-out network switches, idle time
between jobs, restarts after failures, and embodied carbon.
"""

import math
from dataclasses import dataclass

from autoconfig.core.hardware import GPU
from autoconfig.bounds import NON_NEGATIVE, Range, check_number, check_optional
from autoconfig.errors import InputError


@dataclass(frozen=True)
class EnergyAssumptions:
    """The user's or the default (sourced) energy and carbon assumptions."""

    gpu_power_fraction: float
    """Average board power as a fraction of TDP."""
    pue: float
    """Power usage effectiveness of the facility (>= 1)."""
    node_overhead_w: float | None = None
    """Non-GPU power per node; None: from the GPU catalog's node power."""
    grid_kg_per_kwh: float | None = None
    """Carbon intensity of the grid; None: no CO2 figure."""

    def __post_init__(self) -> None:
        check_number("--gpu-power-fraction", self.gpu_power_fraction,
                     Range(0, 1.5, low_open=True))
        check_number("--pue", self.pue, Range(1))
        check_optional("--node-overhead-w", self.node_overhead_w, NON_NEGATIVE)
        check_optional("--grid-kg-per-kwh", self.grid_kg_per_kwh, NON_NEGATIVE)


def default_assumptions(**overrides) -> EnergyAssumptions:
    """The sourced defaults of ``heuristics/energy.yaml``, with overrides (None
    values keep the default)."""
    from autoconfig.heuristics import heuristic
    values = {"gpu_power_fraction": float(heuristic("energy", "gpu_power_fraction").value),
              "pue": float(heuristic("energy", "pue").value)}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return EnergyAssumptions(**values)


def node_overhead_w(gpu: GPU, gpus_per_node: int, assumed: EnergyAssumptions) -> float:
    """Non-GPU watts per node: the user's value, else the datasheet's system
    power minus its GPUs at TDP (scaled to ``gpus_per_node``), else 0."""
    if assumed.node_overhead_w is not None:
        return assumed.node_overhead_w
    if gpu.node_power_w is None or gpu.tdp_w is None:
        return 0.0
    per_gpu = (gpu.node_power_w - gpu.gpus_per_node * gpu.tdp_w) / gpu.gpus_per_node
    return max(per_gpu, 0.0) * gpus_per_node


@dataclass(frozen=True)
class CellCost:
    """Cost, energy and carbon of one cell (None where an input is missing)."""

    gpu_power_w: float | None
    node_overhead_w: float
    pue: float
    price_usd_per_gpu_hour: float | None
    cost_usd: float | None
    energy_kwh: float | None
    grid_kg_per_kwh: float | None
    co2_t: float | None


def cell_cost(gpu: GPU, nodes: int, gpus_per_node: int, days: float,
              assumed: EnergyAssumptions, price: float | None) -> CellCost:
    """The arithmetic of the module docstring for one cell."""
    hours = days * 24.0
    gpus = nodes * gpus_per_node
    overhead = node_overhead_w(gpu, gpus_per_node, assumed)
    power = gpu.tdp_w * assumed.gpu_power_fraction if gpu.tdp_w is not None else None
    energy = None
    if power is not None:
        energy = (gpus * power + nodes * overhead) * hours / 1000.0 * assumed.pue
    co2 = (energy * assumed.grid_kg_per_kwh / 1000.0
           if energy is not None and assumed.grid_kg_per_kwh is not None else None)
    return CellCost(gpu_power_w=power, node_overhead_w=overhead, pue=assumed.pue,
                    price_usd_per_gpu_hour=price,
                    cost_usd=None if price is None else hours * gpus * price,
                    energy_kwh=energy, grid_kg_per_kwh=assumed.grid_kg_per_kwh, co2_t=co2)


def parse_prices(text: str | None, resolve_gpu) -> dict[str, float]:
    """``h100=2.5,a100=1.5`` -> {catalog GPU name: USD per GPU-hour};
    ``resolve_gpu`` maps a name or alias to a GPU (InputError if unknown)."""
    prices: dict[str, float] = {}
    if not text:
        return prices
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        # float() takes nan and inf: a NaN price printed as $nan and was marked cheapest
        if not sep or not name.strip() or not (math.isfinite(price) and price >= 0):
            raise InputError(f"invalid --price {item.strip()!r}: expected GPU=USD per GPU-hour, "
                             "a finite number >= 0 (e.g. h100=2.5), comma-separated")
        gpu = resolve_gpu(name.strip()).name
        if gpu in prices:
            raise InputError(f"invalid --price {text!r}: {gpu} priced twice")
        prices[gpu] = price
    return prices


def price_cells(cells, gpus: dict[str, GPU], assumed: EnergyAssumptions,
                prices: dict[str, float]) -> list[CellCost | None]:
    """CellCost for every capacity cell that has a plan (None for the others)."""
    out = []
    for cell in cells:
        if cell.status != "ok":
            out.append(None)
            continue
        out.append(cell_cost(gpus[cell.gpu], cell.nodes, cell.gpus // cell.nodes,
                             cell.train_days, assumed, prices.get(cell.gpu)))
    return out


def fastest_and_cheapest(cells, costs) -> tuple[int | None, int | None]:
    """Indices of the cell with the fewest days and of the one with the lowest
    cost (None when no cell has a plan, or none has a price)."""
    ok = [i for i, c in enumerate(cells) if c.status == "ok"]
    fastest = min(ok, key=lambda i: cells[i].train_days, default=None)
    priced = [i for i in ok if costs[i] is not None and costs[i].cost_usd is not None]
    cheapest = min(priced, key=lambda i: costs[i].cost_usd, default=None)
    return fastest, cheapest
