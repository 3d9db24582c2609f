import pytest
from specfuzz.fuzz.campaign import Campaign, CampaignConfig
@pytest.mark.parametrize("seed,inj", [(2,"N6"),(3,"N6"),(1,"N3"),(2,"N1")])
def test_probe(tmp_path, monkeypatch, seed, inj):
    confirmations=[]
    confirm = Campaign._confirm
    def spy(self, run, speculation, engine=None):
        conf, j = confirm(self, run, speculation, engine)
        if engine is None: confirmations.append((len(run.case.target_table), run.case.params.max_tokens, conf.failed))
        return conf, j
    monkeypatch.setattr(Campaign, "_confirm", spy)
    c = Campaign(CampaignConfig(budget_s=60, corpus_dir=tmp_path / "corpus", work_dir=tmp_path / "work", engine_kwargs={"inject": inj}, seed=seed))
    c.run()
    print("PROBE", seed, inj, confirmations)
