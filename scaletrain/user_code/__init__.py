"""The user's own code as scaletrain meets it, in one place: a `package.module:name` imported (once
a process: importing.py), a Lightning LightningModule or DataModule recognised and a DataModule's
loaders read (lightning.py), and a failure of theirs shown as theirs (failures.py). Nothing outside
this package imports a user's module or asks whether something is Lightning's
(tests/test_architecture.py); the adapter that trains a LightningModule is adapters/."""
