"""Engine: the step loop that joins the scheduler and an executor."""
