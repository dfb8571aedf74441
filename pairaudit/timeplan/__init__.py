"""The time plan: how long an audit holds its host, per phase and arm, planned before any server starts
(``plan``), from this host's own record of earlier audits (``history``), and set against what each phase
took (``actual``)."""
