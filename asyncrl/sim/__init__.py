"""The simulator: asyncrl's real producer, buffer, proxy and controller on a virtual clock, against cost-model
engines, trainer and rewards (docs/simulator.md)."""
