"""The layout of a run's ranks: hosts, tasks, nodes and ranks (``cluster``), what each task
reports and is told at the rendezvous (``rendezvous``), and which network interface the ranks
use (``interfaces``)."""
