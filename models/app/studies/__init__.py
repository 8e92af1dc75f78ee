"""Studies: the registry (``registry``); a study's folder (``folder.StudyFolder``), its plan in
study.json (``plan.StudyPlan``, checked field by field by ``plan_file``) and how a run ended
(``outcome.Outcome``); the locks (``lock``); one run's task (``run_task``) and the executors that run
it (``in_process_executor``, ``local_executor`` with its ``worker``, ``ray_executor``); the one
scheduling loop (``driver.drive_runs``); the runner that plans a study (``runner``) and the summary
of its results (``summary``). Builds on ``training``."""
