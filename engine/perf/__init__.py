"""Performance accounting: the machine's roofs (probe), what each step costs (step_cost), the verdict
per step (verdict) and predictions for other models and devices (cost_model, labelled predicted)."""
