#!/usr/bin/env python3
"""The topokeeper CDK app: ``npx cdk synth|deploy`` (cdk.json runs this) or ``.venv/bin/python app.py``."""

from infra.app import main

raise SystemExit(main())
