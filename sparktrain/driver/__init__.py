"""Code that runs on the driver (never imports sparktrain.worker)."""
