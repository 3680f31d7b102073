"""What a run left behind, shown: run comparisons and the HTML report with its figures."""
