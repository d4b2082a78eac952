"""The replaying engine source: a recording (app/record/) fed to the same panels as a live run."""
