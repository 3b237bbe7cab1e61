"""``toolpair engine install`` and what it needs: the machine, the build, its record, the models and the plan.

Standard library only, and nothing from the rest of engine_launcher: the Docker image's engine layer
copies this folder whole, builds the engine with it and assembles the bundled model, so an edit
anywhere else keeps that (minutes-long) layer cached.
"""
