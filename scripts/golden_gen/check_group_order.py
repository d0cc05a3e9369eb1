"""Print the hidden-group order and relations braintrace 0.2.6 gives the model of
tests/compiler_report.rs (`WeightOnlyFirst`): a state `a` whose only recurrence runs
through a weight, then a leaky state `b`. Output recorded in that test:
groups 0: [b], 1: [a]; W -> [1], U -> [0].

    $(scripts/ref_python.sh) scripts/golden_gen/check_group_order.py
"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate_e2e as E
import brainstate, braintrace, jax.numpy as jnp
class Net(brainstate.nn.Module):
    def __init__(self):
        super().__init__()
        self.W = braintrace.nn.Linear(3 + 4, 4)
        self.U = braintrace.nn.Linear(3, 4)
    def init_state(self, batch_size=None, **kw):
        self.a = brainstate.HiddenState(jnp.zeros((batch_size, 4)))
        self.b = brainstate.HiddenState(jnp.zeros((batch_size, 4)))
    def update(self, x):
        a = jnp.tanh(self.W(jnp.concatenate([x, self.a.value], -1)))
        self.a.value = a
        self.b.value = 0.9 * self.b.value + self.U(x) + a
        return self.b.value
net = Net()
l = braintrace.compile(net, braintrace.D_RTRL, jnp.zeros((2, 3)), batch_size=2)
for g in l.graph.hidden_groups:
    print(g.index, [E.path_str(p) for p in g.hidden_paths])
for r in l.graph.hidden_param_op_relations:
    print(r.primitive.name, {k: E.path_str(p) for k,p in r.trainable_paths.items()}, [g.index for g in r.hidden_groups])
