"""The supervisor: everything that talks to Docker and moves jobs between phases.

- docker_hosts: Docker clients and container specs;
- logs: the persisted log of each task run and the follower that fills it;
- schedule, start, follow, decide, stop: the verbs of a job's life (lifecycle: what they share);
- later: the typed hand-off of work to the Celery worker;
- reconcile: the periodic steps that make a crashed worker lose nothing.
"""
