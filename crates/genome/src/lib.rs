//! Genome sequence matching on kura (issue 5): FASTA/FASTQ streaming, a packed reference, a minimizer index and a read mapper.
