"""Host diagnosis: the checks ``iomatrix doctor`` runs before a first measurement (doctor)."""
