module oneplus/bench/fgd_reference

go 1.19
