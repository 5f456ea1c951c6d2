"""Reading a run's records afterwards: phases, stragglers, advice, the report and the trace."""
