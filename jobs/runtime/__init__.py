"""The supervisor: everything that talks to Docker and moves jobs between phases.

- docker_hosts: Docker clients and container specs;
- logs: the persisted log of each task run and the follower that fills it;
- lifecycle: schedule, start, end-of-attempt decision, stop;
- reconcile: the periodic steps that make a crashed worker lose nothing.
"""
