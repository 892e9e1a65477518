import sys, optuna
url = sys.argv[1]
for st in optuna.get_all_study_summaries(url):
    study = optuna.load_study(study_name=st.study_name, storage=url)
    print(st.study_name)
    for t in study.trials:
        print(t.number, t.state.name, t.value, t.user_attrs.get("reason"), (t.user_attrs.get("message") or "")[:100])
