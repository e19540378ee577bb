"""The bridge to the C++ core: config, the plan entry, the pass and pass pipelines."""
