"""AI Ops analyses: what starts them (`intake`) and the outside systems their tools read."""
