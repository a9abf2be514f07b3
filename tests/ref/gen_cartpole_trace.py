#!/usr/bin/python3
"""Reference trace for apps/rl_cartpole's CartPole-v1 (test_cartpole).

An independent reimplementation of gym 0.26's CartPoleEnv.step (Euler
integrator) plus TimeLimit(500), written from gym's documented equations in
NumPy float64, drives fixed action sequences and records every state:
    /usr/bin/python3 tests/ref/gen_cartpole_trace.py
writes tests/data/cartpole_trace.npy, float64 [rows, 8]:
    episode, action, x, x_dot, theta, theta_dot, terminated, truncated
A row with action -1 holds an episode's initial state; every other row the
state after applying `action` to the previous row's state. Episodes:
  0  random actions from a seeded generator until the pole falls
  1  a linear balancing controller: runs into the 500-step limit (truncated)
  2  a controller that balances while steering the cart off the track (|x| > 2.4)
  3  always push right: the pole falls backwards
The actions are fixed in the file, so the C test replays them blindly.
"""
import math
import os

import numpy as np

GRAVITY, MASSCART, MASSPOLE, LENGTH, FORCE_MAG, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASSPOLE + MASSCART
POLEMASS_LENGTH = MASSPOLE * LENGTH
THETA_LIMIT = 12 * 2 * math.pi / 360
X_LIMIT = 2.4
MAX_STEPS = 500


def step(s, action):
    x, x_dot, theta, theta_dot = s
    force = FORCE_MAG if action == 1 else -FORCE_MAG
    c, si = math.cos(theta), math.sin(theta)
    temp = (force + POLEMASS_LENGTH * theta_dot ** 2 * si) / TOTAL_MASS
    thetaacc = (GRAVITY * si - c * temp) / (LENGTH * (4.0 / 3.0 - MASSPOLE * c ** 2 / TOTAL_MASS))
    xacc = temp - POLEMASS_LENGTH * thetaacc * c / TOTAL_MASS
    x = x + TAU * x_dot
    x_dot = x_dot + TAU * xacc
    theta = theta + TAU * theta_dot
    theta_dot = theta_dot + TAU * thetaacc
    terminated = x < -X_LIMIT or x > X_LIMIT or theta < -THETA_LIMIT or theta > THETA_LIMIT
    return (x, x_dot, theta, theta_dot), terminated


def episode(ep, s0, policy, rows):
    rows.append([ep, -1, *s0, 0, 0])
    s, n = s0, 0
    while True:
        a = policy(s, n)
        s, term = step(s, a)
        n += 1
        trunc = n >= MAX_STEPS
        rows.append([ep, a, *s, float(term), float(trunc)])
        if term or trunc:
            return n, term, trunc


def main():
    rng = np.random.RandomState(2024)
    rows = []
    s0 = lambda: tuple(float(v) for v in rng.uniform(-0.05, 0.05, 4))
    acts = rng.randint(0, 2, 1000)
    print(episode(0, s0(), lambda s, n: int(acts[n]), rows))
    balance = lambda s, n: int(s[2] + 0.5 * s[3] + 0.01 * s[0] + 0.1 * s[1] > 0)
    print(episode(1, s0(), balance, rows))
    drift = lambda s, n: int(s[2] + 0.5 * s[3] + 0.02 * (s[0] - 4.0) + 0.1 * s[1] > 0)
    print(episode(2, s0(), drift, rows))
    print(episode(3, s0(), lambda s, n: 1, rows))
    out = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "cartpole_trace.npy")
    np.save(out, np.array(rows, dtype=np.float64))
    print("wrote", out, len(rows), "rows")


if __name__ == "__main__":
    main()
