"""Link rates the simulator's own cluster loaders need, each from a row of
`data/bandwidth/measured_bandwidth_reference.csv` (category, hardware, value_GBps).

Clusters built from the YAML spec take their matrices from `oneplus_topology` instead.
"""

# spec, PCIe Gen4 x16, per link, unidirectional, 31
PCIE_GEN4_GBPS = 31.0
# spec, PCIe Gen5 x16, per link, unidirectional, 63
PCIE_GEN5_GBPS = 63.0
# spec, IB HDR 200Gb/s, per NIC, unidirectional, 25
NIC_HDR_GBPS = 25.0
# spec, IB NDR 400Gb/s, per NIC, unidirectional, 50
NIC_NDR_GBPS = 50.0
# spec, NVLink4 (H100/H200/H800=8 links), per GPU, 450 over 18 links
NVLINK4_PER_LINK_GBPS = 450.0 / 18
