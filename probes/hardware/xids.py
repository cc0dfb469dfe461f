"""NVIDIA's Xid catalog for Ampere and newer GPUs (``SOURCE``: its "Xids" sheet, codes 1-172, and the
"Guidance Classes" sheet for what each "Resolution Bucket (Immediate Action)" means), and what
`healthcheck serve` does with each Xid. Mnemonics, descriptions (shortened) and buckets are the
catalog's ("" where it gives none); the policy per bucket is ours (docs/serve.md, "Xid policy")."""

from __future__ import annotations

from typing import NamedTuple

SOURCE = ('NVIDIA, "Analyzing Xid Errors with the Xid Catalog", '
          "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, read 2026-11-24")

# The catalog's immediate-action buckets, spelled as it spells them.
IGNORE, RESTART_APP, RESET_GPU, RESTART_BM, RESTART_VM = (
    "IGNORE", "RESTART_APP", "RESET_GPU", "RESTART_BM", "RESTART_VM")
CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW, CHECK_UVM, XID_154 = (
    "CONTACT_SUPPORT", "CHECK_MECHANICALS", "UPDATE_SWFW", "CHECK_UVM", "XID_154")
WORKFLOW_XID_45, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR = (
    "WORKFLOW_XID_45", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR")
NO_BUCKET = ""

# What serve does: latch (critical), warn for 10 minutes (application, other), count (no-action).
CRITICAL, APPLICATION, OTHER, NO_ACTION = "critical", "application", "other", "no-action"


class Bucket(NamedTuple):
    severity: str  # CRITICAL, APPLICATION, OTHER or NO_ACTION
    label: str  # a metric's ``action`` label: the immediate action whatever serve's policy
    todo: str  # the remedy, in a few words
    why: str  # why serve latches or not (the docs' policy table)


# A workflow whose recovery is a reset is a reset; a VM's restart is, for a container in that VM, a reboot.
BUCKETS: dict[str, Bucket] = {
    RESET_GPU: Bucket(
        CRITICAL, "reset-gpu", "reset the GPU (nvidia-smi -r) or reboot the node",
        "the catalog's immediate action is a GPU reset: nothing on this GPU can be trusted until then"),
    RESTART_BM: Bucket(
        CRITICAL, "reboot", "reboot the node", "the catalog's immediate action is a reboot of the machine"),
    RESTART_VM: Bucket(
        CRITICAL, "reboot", "restart the virtual machine that owns the GPU",
        "the VM that owns the GPU must restart: for a container in that VM, the machine's reboot"),
    WORKFLOW_XID_48: Bucket(
        CRITICAL, "reset-gpu", "reset the GPU (with Xid 63 or 64: drain, then reset)",
        "its workflow's recovery action is RESET_GPU alone and DRAIN_AND_RESET with Xid 63/64: "
        "a reset either way"),
    WORKFLOW_NVLINK_ERR: Bucket(
        CRITICAL, "reset-gpu", "reset the GPU or reboot the node; if it returns, check the NVLink links",
        "the catalog's text: a GPU reset or node reboot is needed to clear this error (the workflow then "
        "reads the message's registers for the cause)"),
    RESTART_APP: Bucket(
        APPLICATION, "restart-app", "restart the application; check the workload's log",
        "the application's error, possibly another tenant's: restarting it recovers, the catalog deems no "
        "reset or reboot necessary"),
    IGNORE: Bucket(NO_ACTION, "ignore", "none needed", "the catalog: no action required"),
    WORKFLOW_XID_45: Bucket(
        OTHER, "see-other-xid", "act on the Xid logged with it; alone, restart the fabric manager",
        "it follows another Xid, which decides; an event cannot tell whether it came alone"),
    WORKFLOW_NVLINK5_ERR: Bucket(
        OTHER, "decode-log", "decode the kernel log's Xid line (the catalog's Xid 144-150 decode); the nvml "
                             "probe reports a required reset",
        "the action depends on the message's IntrInfo and error status, which an NVML event does not carry; "
        "a needed reset also changes the GPU recovery action, which the nvml probe reads"),
    XID_154: Bucket(
        OTHER, "see-recovery-action", "see the nvml probe's GPU recovery action",
        "it summarizes the recovery action another Xid needs; the nvml probe reads that action itself"),
    CHECK_MECHANICALS: Bucket(
        OTHER, "check-mechanicals", "check the GPU's seating and power connections",
        "a person must check the hardware; a reset or a restart repairs nothing"),
    UPDATE_SWFW: Bucket(
        OTHER, "update-firmware", "update the driver and firmware (guest and host)",
        "a vGPU could not start: only a software or firmware update helps"),
    CHECK_UVM: Bucket(
        OTHER, "check-uvm", "with UVM or vGPU in use, reset the GPU; otherwise nothing",
        "a reset only where UVM or vGPU is in use, which an event cannot tell (HEALTHCHECK_XID_CRITICAL=159 "
        "where it is)"),
    CONTACT_SUPPORT: Bucket(
        OTHER, "contact-support", "contact support",
        "no action a machine can take; most are unused since Ampere"),
    NO_BUCKET: Bucket(
        OTHER, "none-named", "see the catalog's notes for this Xid",
        "the catalog names no immediate action (newer entries); HEALTHCHECK_XID_CRITICAL adds one"),
}
UNKNOWN = Bucket(OTHER, "unknown", "see NVIDIA's current Xid documentation",
                 "not in the catalog read here: shown, never latched")


class Xid(NamedTuple):
    mnemonic: str
    meaning: str  # the catalog's description
    action: str  # its "Resolution Bucket (Immediate Action)"


UNUSED = "unused on Ampere and newer"
CATALOG: dict[int, Xid] = {
    1: Xid("ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", UNUSED, CONTACT_SUPPORT),
    2: Xid("ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", UNUSED, CONTACT_SUPPORT),
    3: Xid("ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", UNUSED, CONTACT_SUPPORT),
    4: Xid("ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", UNUSED, CONTACT_SUPPORT),
    5: Xid("ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", UNUSED, CONTACT_SUPPORT),
    6: Xid("ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", UNUSED, CONTACT_SUPPORT),
    7: Xid("ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", UNUSED, CONTACT_SUPPORT),
    8: Xid("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", RESTART_APP),
    9: Xid("ROBUST_CHANNEL_GR_ERROR_INSTANCE", UNUSED, CONTACT_SUPPORT),
    10: Xid("ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", UNUSED, CONTACT_SUPPORT),
    11: Xid("ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "invalid or corrupted push buffer stream", RESTART_APP),
    12: Xid("ROBUST_CHANNEL_GR_ERROR_SW_METHOD", UNUSED, CONTACT_SUPPORT),
    13: Xid("ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception (an application fault: out of bounds, "
                                           "illegal instruction)", RESTART_APP),
    14: Xid("ROBUST_CHANNEL_FAKE_ERROR", "fake or injected error from user space", IGNORE),
    15: Xid("ROBUST_CHANNEL_SCANLINE_TIMEOUT", UNUSED, CONTACT_SUPPORT),
    16: Xid("ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", UNUSED, CONTACT_SUPPORT),
    17: Xid("ROBUST_CHANNEL_PARAMETER_ERROR", UNUSED, CONTACT_SUPPORT),
    18: Xid("ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", UNUSED, CONTACT_SUPPORT),
    19: Xid("ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", UNUSED, CONTACT_SUPPORT),
    20: Xid("ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", UNUSED, CONTACT_SUPPORT),
    21: Xid("ROBUST_CHANNEL_ME_ERROR_SW_METHOD", UNUSED, CONTACT_SUPPORT),
    22: Xid("ROBUST_CHANNEL_VP_ERROR_SW_METHOD", UNUSED, CONTACT_SUPPORT),
    23: Xid("ROBUST_CHANNEL_RC_LOGGING_ENABLED", UNUSED, CONTACT_SUPPORT),
    24: Xid("ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", UNUSED, CONTACT_SUPPORT),
    25: Xid("ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "invalid or illegal push buffer stream", RESTART_APP),
    26: Xid("ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", UNUSED, CONTACT_SUPPORT),
    27: Xid("ROBUST_CHANNEL_VP_ERROR", UNUSED, CONTACT_SUPPORT),
    28: Xid("ROBUST_CHANNEL_VP2_ERROR", UNUSED, CONTACT_SUPPORT),
    29: Xid("ROBUST_CHANNEL_BSP_ERROR", UNUSED, CONTACT_SUPPORT),
    30: Xid("ROBUST_CHANNEL_BAD_ADDR_ACCESS", UNUSED, CONTACT_SUPPORT),
    31: Xid("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", RESTART_APP),
    32: Xid("ROBUST_CHANNEL_PBDMA_ERROR", "invalid or corrupted push buffer stream", RESTART_APP),
    33: Xid("ROBUST_CHANNEL_SEC_ERROR", UNUSED, CONTACT_SUPPORT),
    34: Xid("ROBUST_CHANNEL_MSVLD_ERROR", UNUSED, CONTACT_SUPPORT),
    35: Xid("ROBUST_CHANNEL_MSPDEC_ERROR", UNUSED, CONTACT_SUPPORT),
    36: Xid("ROBUST_CHANNEL_MSPPP_ERROR", UNUSED, CONTACT_SUPPORT),
    37: Xid("ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "driver firmware error", IGNORE),
    38: Xid("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "driver firmware error", IGNORE),
    39: Xid("ROBUST_CHANNEL_CE0_ERROR", "copy engine exception", RESTART_APP),
    40: Xid("ROBUST_CHANNEL_CE1_ERROR", "copy engine exception", RESTART_APP),
    41: Xid("ROBUST_CHANNEL_CE2_ERROR", "copy engine exception", RESTART_APP),
    42: Xid("ROBUST_CHANNEL_VIC_ERROR", UNUSED, CONTACT_SUPPORT),
    43: Xid("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (an application's software "
                                                       "fault; the GPU stays healthy)", IGNORE),
    44: Xid("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "graphics engine fault during context switch", IGNORE),
    45: Xid("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "preemptive cleanup after earlier errors (an application "
                                                 "aborted or killed)", WORKFLOW_XID_45),
    46: Xid("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", RESET_GPU),
    47: Xid("ROBUST_CHANNEL_NVENC0_ERROR", UNUSED, CONTACT_SUPPORT),
    48: Xid("ROBUST_CHANNEL_GPU_ECC_DBE", "double-bit ECC error", WORKFLOW_XID_48),
    49: Xid("SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", UNUSED, CONTACT_SUPPORT),
    50: Xid("SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", UNUSED, CONTACT_SUPPORT),
    51: Xid("SILENT_RUNNING_STRESS_TEST_FAILURE", UNUSED, CONTACT_SUPPORT),
    52: Xid("SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", UNUSED, CONTACT_SUPPORT),
    53: Xid("SILENT_RUNNING_TEMP_REDUCED_CLOCKING", UNUSED, CONTACT_SUPPORT),
    54: Xid("SILENT_RUNNING_PWR_REDUCED_CLOCKING", "auxiliary power is not connected to the GPU board",
            CHECK_MECHANICALS),
    55: Xid("SILENT_RUNNING_TEMPERATURE_READ_ERROR", UNUSED, CONTACT_SUPPORT),
    56: Xid("DISPLAY_CHANNEL_EXCEPTION", UNUSED, CONTACT_SUPPORT),
    57: Xid("FB_LINK_TRAINING_FAILURE_ERROR", UNUSED, CONTACT_SUPPORT),
    58: Xid("FB_MEMORY_ERROR", UNUSED, CONTACT_SUPPORT),
    59: Xid("PMU_ERROR", UNUSED, CONTACT_SUPPORT),
    60: Xid("ROBUST_CHANNEL_SEC2_ERROR", "video processor exception", RESTART_APP),
    61: Xid("PMU_BREAKPOINT", UNUSED, CONTACT_SUPPORT),
    62: Xid("PMU_HALT_ERROR", "internal micro-controller halt", RESET_GPU),
    63: Xid("INFOROM_DRAM_RETIREMENT_EVENT",
            "GPU memory remapping event (the nvml probe judges a pending remap)", IGNORE),
    64: Xid("INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", RESET_GPU),
    65: Xid("ROBUST_CHANNEL_NVENC1_ERROR", UNUSED, CONTACT_SUPPORT),
    66: Xid("ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "illegal access by driver", IGNORE),
    67: Xid("ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "illegal access by driver", IGNORE),
    68: Xid("ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 exception", RESTART_APP),
    69: Xid("ROBUST_CHANNEL_GR_CLASS_ERROR", "graphics engine class error", RESTART_APP),
    70: Xid("ROBUST_CHANNEL_CE3_ERROR", "CE3: unknown error", RESTART_APP),
    71: Xid("ROBUST_CHANNEL_CE4_ERROR", "CE4: unknown error", RESTART_APP),
    72: Xid("ROBUST_CHANNEL_CE5_ERROR", "CE5: unknown error", RESTART_APP),
    73: Xid("ROBUST_CHANNEL_NVENC2_ERROR", UNUSED, CONTACT_SUPPORT),
    74: Xid("NVLINK_ERROR", "NVLink error", WORKFLOW_NVLINK_ERR),
    75: Xid("ROBUST_CHANNEL_CE6_ERROR", "CE6: unknown error", RESTART_APP),
    76: Xid("ROBUST_CHANNEL_CE7_ERROR", "CE7: unknown error", RESTART_APP),
    77: Xid("ROBUST_CHANNEL_CE8_ERROR", "CE8: unknown error", RESTART_APP),
    78: Xid("VGPU_START_ERROR", "vGPU start error", UPDATE_SWFW),
    79: Xid("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", RESTART_BM),
    80: Xid("PBDMA_PUSHBUFFER_CRC_MISMATCH", "corrupted data sent to GPU", RESTART_APP),
    81: Xid("ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", UNUSED, CONTACT_SUPPORT),
    82: Xid("ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 error", RESTART_APP),
    83: Xid("ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 error", RESTART_APP),
    84: Xid("ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 error", RESTART_APP),
    85: Xid("ROBUST_CHANNEL_CE9_ERROR", "CE9: unknown error", RESTART_APP),
    86: Xid("ROBUST_CHANNEL_OFA0_ERROR", "OFA exception", RESTART_APP),
    87: Xid("NVTELEMETRY_DRIVER_REPORT", UNUSED, CONTACT_SUPPORT),
    88: Xid("ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 error", RESTART_APP),
    89: Xid("ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 error", RESTART_APP),
    90: Xid("LTC_ERROR", UNUSED, CONTACT_SUPPORT),
    91: Xid("RESERVED_XID", UNUSED, CONTACT_SUPPORT),
    92: Xid("EXCESSIVE_SBE_INTERRUPTS", "high single-bit ECC error rate", IGNORE),
    93: Xid("INFOROM_ERASE_LIMIT_EXCEEDED", "non-fatal violation of the provisioned InfoROM wear limit",
            IGNORE),
    94: Xid("ROBUST_CHANNEL_CONTAINED_ERROR", "contained memory error (only the application that touched it)",
            RESTART_APP),
    95: Xid("ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained memory error (every application on the GPU)",
            RESET_GPU),
    96: Xid("ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 error", RESTART_APP),
    97: Xid("ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 error", RESTART_APP),
    98: Xid("ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 error", RESTART_APP),
    99: Xid("ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 error", RESTART_APP),
    100: Xid("ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 error", RESTART_APP),
    101: Xid("ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 error", RESTART_APP),
    102: Xid("ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 error", RESTART_APP),
    103: Xid("ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 error", RESTART_APP),
    104: Xid("ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 error", RESTART_APP),
    105: Xid("ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 error", RESTART_APP),
    106: Xid("SMBPBI_TEST_MESSAGE", "SMBPBI test message", IGNORE),
    107: Xid("SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI test message (silent)", IGNORE),
    108: Xid("NVLINK_REMOTE_TRANSLATION_ERROR", "unused (NVLink remote translation error)", IGNORE),
    109: Xid("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", RESET_GPU),
    110: Xid("SEC_FAULT_ERROR", "security fault error", RESET_GPU),
    111: Xid("BUNDLE_ERROR_EVENT", UNUSED, CONTACT_SUPPORT),
    112: Xid("DISP_SUPERVISOR_ERROR", UNUSED, CONTACT_SUPPORT),
    113: Xid("DP_LT_FAILURE", UNUSED, CONTACT_SUPPORT),
    114: Xid("HEAD_RG_UNDERFLOW", UNUSED, CONTACT_SUPPORT),
    115: Xid("CORE_CHANNEL_REGS", UNUSED, CONTACT_SUPPORT),
    116: Xid("WINDOW_CHANNEL_REGS", UNUSED, CONTACT_SUPPORT),
    117: Xid("CURSOR_CHANNEL_REGS", UNUSED, CONTACT_SUPPORT),
    118: Xid("HEAD_REGS", UNUSED, CONTACT_SUPPORT),
    119: Xid("GSP_RPC_TIMEOUT", "GSP RPC timeout", RESET_GPU),
    120: Xid("GSP_ERROR", "GSP error", RESET_GPU),
    121: Xid("C2C_ERROR", "C2C error (corrected errors on the link to a Grace CPU)", IGNORE),
    122: Xid("SPI_PMU_RPC_READ_FAIL", UNUSED, CONTACT_SUPPORT),
    123: Xid("SPI_PMU_RPC_WRITE_FAIL", UNUSED, CONTACT_SUPPORT),
    124: Xid("SPI_PMU_RPC_ERASE_FAIL", UNUSED, CONTACT_SUPPORT),
    125: Xid("INFOROM_FS_ERROR", UNUSED, CONTACT_SUPPORT),
    126: Xid("ROBUST_CHANNEL_CE10_ERROR", "CE10: unknown error", RESTART_APP),
    127: Xid("ROBUST_CHANNEL_CE11_ERROR", "CE11: unknown error", RESTART_APP),
    128: Xid("ROBUST_CHANNEL_CE12_ERROR", "CE12: unknown error", RESTART_APP),
    129: Xid("ROBUST_CHANNEL_CE13_ERROR", "CE13: unknown error", RESTART_APP),
    130: Xid("ROBUST_CHANNEL_CE14_ERROR", "CE14: unknown error", RESTART_APP),
    131: Xid("ROBUST_CHANNEL_CE15_ERROR", "CE15: unknown error", RESTART_APP),
    132: Xid("ROBUST_CHANNEL_CE16_ERROR", "CE16: unknown error", RESTART_APP),
    133: Xid("ROBUST_CHANNEL_CE17_ERROR", "CE17: unknown error", RESTART_APP),
    134: Xid("ROBUST_CHANNEL_CE18_ERROR", "CE18: unknown error", RESTART_APP),
    135: Xid("ROBUST_CHANNEL_CE19_ERROR", "CE19: unknown error", RESTART_APP),
    136: Xid("ALI_TRAINING_FAIL", "link training failed", RESET_GPU),
    137: Xid("NVLINK_PRIV_ERR", "NVLink privilege error (an illegal peer-to-peer access)", IGNORE),
    138: Xid("ROBUST_CHANNEL_DLA_ERROR", UNUSED, CONTACT_SUPPORT),
    139: Xid("ROBUST_CHANNEL_OFA1_ERROR", "OFA1 error", RESTART_APP),
    140: Xid("UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC unrecovered error", RESET_GPU),
    141: Xid("ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA fast path error", IGNORE),
    142: Xid("ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 error", CONTACT_SUPPORT),
    143: Xid("GPU_INIT_ERROR", "GPU initialization error", RESET_GPU),
    144: Xid("NVLINK_SAW_ERROR", "NVLink: SAW error", WORKFLOW_NVLINK5_ERR),
    145: Xid("NVLINK_RLW_ERROR", "NVLink: RLW error", WORKFLOW_NVLINK5_ERR),
    146: Xid("NVLINK_TLW_ERROR", "NVLink: TLW error", WORKFLOW_NVLINK5_ERR),
    147: Xid("NVLINK_TREX_ERROR", "NVLink: TREX error", WORKFLOW_NVLINK5_ERR),
    148: Xid("NVLINK_NVLPW_CTRL_ERROR", "NVLink: NVLPW_CTRL error", WORKFLOW_NVLINK5_ERR),
    149: Xid("NVLINK_NETIR_ERROR", "NVLink: NETIR error", WORKFLOW_NVLINK5_ERR),
    150: Xid("NVLINK_MSE_ERROR", "NVLink: MSE error", WORKFLOW_NVLINK5_ERR),
    151: Xid("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "key rotation error", RESTART_VM),
    152: Xid("ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU error", IGNORE),
    153: Xid("ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout error", IGNORE),
    154: Xid("GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed", XID_154),
    155: Xid("NVLINK_SW_DEFINED_ERROR", "NVLink: software-defined error (an intentional link down)",
             RESET_GPU),
    156: Xid("RESOURCE_RETIREMENT_EVENT", "resource retirement event", RESET_GPU),
    157: Xid("RESOURCE_RETIREMENT_FAILURE", "resource retirement failure (no repair left; work can go on)",
             IGNORE),
    158: Xid("GPU_FATAL_TIMEOUT", "GPU fatal timeout", RESET_GPU),
    159: Xid("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI non-data error", CHECK_UVM),
    160: Xid("CHANNEL_RETIREMENT_EVENT", "channel retirement event", IGNORE),
    161: Xid("CHANNEL_RETIREMENT_FAILURE", "channel retirement failure", IGNORE),
    162: Xid("PSHC_REENGAGED", "power smoothing circuitry re-engaged", NO_BUCKET),
    163: Xid("PSHC_DISENGAGED", "power smoothing circuitry disengaged (no GPU reset needed)", NO_BUCKET),
    164: Xid("PSHC_LOW_LIFETIME", "power smoothing circuitry near the end of its lifetime", NO_BUCKET),
    165: Xid("PSHC_ZERO_LIFETIME", "power smoothing circuitry lifetime exhausted", NO_BUCKET),
    166: Xid("NVLINK_SECURE_CRYPTO_ERR",
             "confidential-computing traffic before the link was set up to encrypt it", NO_BUCKET),
    167: Xid("PCIE_FATAL_TIMEOUT", "PCIe fatal timeout", NO_BUCKET),
    168: Xid("REDUCED_GPU_MEMORY_CAPACITY", "errors in the write-protected region (seen with ECC off)",
             NO_BUCKET),
    169: Xid("SEC2_HALT_ERROR", "internal micro-controller halt", NO_BUCKET),
    170: Xid("NVLINK_SECURE_OTHER", "interrupt seen in confidential-computing mode", NO_BUCKET),
    171: Xid("UNCORRECTABLE_DRAM_ERROR", "the DRAM details of an Xid 48", NO_BUCKET),
    172: Xid("UNCORRECTABLE_SRAM_ERROR", "the SRAM details of an Xid 48", NO_BUCKET),
}


def bucket(xid: int) -> Bucket:
    """What serve does with an Xid by default (no setting overrides it here)."""
    return BUCKETS[CATALOG[xid].action] if xid in CATALOG else UNKNOWN


def latches(xid: int) -> bool:
    return bucket(xid).severity == CRITICAL


def describe(xid: int) -> str:
    return f"{x.mnemonic}: {x.meaning}" if (x := CATALOG.get(xid)) else "not in NVIDIA's Xid catalog"
