"""A study's stages, in the order they run: locate → bridge targets → sweep → methods → steps
axis → metrics → latency. Each module holds one stage's unit of work, a module-level function
``unit(run, *args)`` made of jobs in the run's store (so an executor can ship it to a worker and a
killed run resumes), and the constants its job keys and record entries depend on."""
