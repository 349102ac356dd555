"""The study: a suite's plan, its stages as resumable jobs in a store, where they run (executors),
preflight checks, and the sealed run record it ends with."""
