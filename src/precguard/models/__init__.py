"""Small models written by hand for the built-in targets, the demo and the calibration corpus."""
