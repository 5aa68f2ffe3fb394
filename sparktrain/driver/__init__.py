"""Code that runs on the driver (never imports sparktrain.worker).

A call of ``SparkRunner.run`` finds its place (:mod:`sparktrain.driver.places`: the driver's
processes, a classic session, a Spark Connect session), is checked and pickled by
:mod:`sparktrain.driver.controller`, and runs as the attempts of
:mod:`sparktrain.driver.attempts`, each seen through by a
:class:`~sparktrain.driver.monitor.RunMonitor`.
"""
