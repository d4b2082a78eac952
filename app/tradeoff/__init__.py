"""The speed/cost/quality tradeoff: the sweep over batch x weight format x draft (one measured point each), quality
scoring, the Pareto frontier, stored points per machine and model, the live meter, and the roofline feed
(probed roofs, step verdicts)."""
